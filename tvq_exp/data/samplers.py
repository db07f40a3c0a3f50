"""Batch samplers over a 1-D byte array: random windows, contiguous streams, whole-split evaluation.

Every sampler is an iterable of ready batches ``{"input": (B, T) int64, "target": (B, T) int64,
"reset": (B,) bool}``; ``target`` holds :data:`IGNORE_INDEX` at padded positions. Batches are built in the
main process by numpy fancy indexing (cheap), so no DataLoader workers are needed and the sampler's
position is exact when Lightning checkpoints it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any, Protocol

import numpy as np
import torch

IGNORE_INDEX = -100

Batch = dict[str, torch.Tensor]


def window_batch(data: np.ndarray, starts: np.ndarray, seq_len: int, reset: bool) -> Batch:
    """Windows ``data[s : s + T + 1]`` for each start ``s``: input = first T bytes, target = last T bytes."""
    chunk = torch.from_numpy(data[starts[:, None] + np.arange(seq_len + 1)].astype(np.int64))
    return {
        "input": chunk[:, :-1].contiguous(),
        "target": chunk[:, 1:].contiguous(),
        "reset": torch.full((len(starts),), reset, dtype=torch.bool),
    }


def check_split_size(name: str, size: int, seq_len: int) -> None:
    """Raise ``ValueError`` when a split cannot hold one window of ``seq_len + 1`` bytes."""
    if size < seq_len + 1:
        raise ValueError(f"split {name!r} has {size} bytes, fewer than seq_len + 1 = {seq_len + 1}")


class TrainSampler(Protocol):
    """What :class:`TrainLoader` needs from a training sampler."""

    def __iter__(self) -> Iterator[Batch]: ...
    def __len__(self) -> int: ...
    def set_epoch(self, epoch: int) -> None: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class RandomWindowSampler:
    """Random training windows.

    Each of ``steps_per_epoch`` steps yields ``batch_size`` windows at uniform random starts
    ``i in [0, n - T - 1]``: input ``x[i:i+T]``, target ``x[i+1:i+T+1]`` (both ``(B, T)``), reset all True.
    The generator of epoch ``e`` is ``default_rng([seed, rank, e])``: reproducible, different per rank.
    """

    def __init__(
        self,
        data: np.ndarray,
        seq_len: int,
        batch_size: int,
        steps_per_epoch: int,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        check_split_size("train", len(data), seq_len)
        self.data = data
        self.seq_len = seq_len
        self.batch_size = batch_size
        self.steps_per_epoch = steps_per_epoch
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.epoch = 0
        self.step = 0

    def __len__(self) -> int:
        return self.steps_per_epoch

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its first step (no-op when already in it, e.g. after a resume)."""
        if epoch != self.epoch:
            self.epoch, self.step = epoch, 0

    def __iter__(self) -> Iterator[Batch]:
        if self.step >= self.steps_per_epoch:
            self.set_epoch(self.epoch + 1)
        rng = np.random.default_rng([self.seed, self.rank, self.epoch])
        high = len(self.data) - self.seq_len
        for _ in range(self.step):
            rng.integers(0, high, size=self.batch_size)
        for step in range(self.step, self.steps_per_epoch):
            starts = rng.integers(0, high, size=self.batch_size)
            self.step = step + 1
            yield window_batch(self.data, starts, self.seq_len, reset=True)

    def state_dict(self) -> dict[str, Any]:
        """Position (epoch, step); the generator is re-derived from the seed."""
        return {"epoch": self.epoch, "step": self.step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.step = int(state["epoch"]), int(state["step"])


class StreamSampler:
    """Transformer-XL style contiguous streams.

    The training split (after a random start offset in ``[0, T)`` drawn once per epoch) is cut into
    ``batch_size * world_size`` equal streams of length ``L``; rank ``r`` owns streams
    ``r*B ... r*B + B - 1``. Step ``j`` yields bytes ``[j*T, j*T + T]`` of each owned stream, so row ``b`` of
    step ``j + 1`` continues row ``b`` of step ``j``. ``reset`` is True on step 0 of each epoch only.
    ``state_dict`` holds the position and the offset generator's state so a resume continues exactly.
    """

    def __init__(
        self,
        data: np.ndarray,
        seq_len: int,
        batch_size: int,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        random_offset: bool = True,
    ) -> None:
        check_split_size("train", len(data), seq_len)
        num_streams = batch_size * world_size
        self.stream_len = (len(data) - (seq_len - 1 if random_offset else 0)) // num_streams
        self.steps = (self.stream_len - 1) // seq_len
        if self.steps < 1:
            raise ValueError(
                f"split 'train' has {len(data)} bytes: too few for {num_streams} streams of at least "
                f"seq_len + 1 = {seq_len + 1} bytes; lower batch_size or seq_len"
            )
        self.data = data
        self.seq_len = seq_len
        self.batch_size = batch_size
        self.rank = rank
        self.world_size = world_size
        self.random_offset = random_offset
        self.rng = np.random.default_rng(seed)
        self.epoch = 0
        self.step = 0
        self.offset: int | None = None

    def __len__(self) -> int:
        return self.steps

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its first step with a fresh offset (no-op when already in it)."""
        if epoch != self.epoch:
            self.epoch, self.step, self.offset = epoch, 0, None

    def stream_starts(self) -> np.ndarray:
        """Start index of each stream owned by this rank, ``(B,)``, for the current epoch's offset."""
        if self.offset is None:
            self.offset = int(self.rng.integers(self.seq_len)) if self.random_offset else 0
        streams = self.rank * self.batch_size + np.arange(self.batch_size)
        return self.offset + streams * self.stream_len

    def __iter__(self) -> Iterator[Batch]:
        if self.step >= self.steps:
            self.set_epoch(self.epoch + 1)
        starts = self.stream_starts()
        for step in range(self.step, self.steps):
            self.step = step + 1
            yield window_batch(self.data, starts + step * self.seq_len, self.seq_len, reset=step == 0)

    def state_dict(self) -> dict[str, Any]:
        """Epoch, step, this epoch's offset and the offset generator (JSON, safe for ``weights_only`` loads)."""
        return {
            "epoch": self.epoch,
            "step": self.step,
            "offset": self.offset,
            "rng": json.dumps(self.rng.bit_generator.state),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.step = int(state["epoch"]), int(state["step"])
        self.offset = None if state["offset"] is None else int(state["offset"])
        self.rng.bit_generator.state = json.loads(state["rng"])


class EvalSegmentSampler:
    """Whole-split evaluation in contiguous segments.

    The split is cut into ``num_streams`` contiguous streams (lengths differ by at most one byte; the
    number does not depend on the world size, so results do not either). Rank ``r`` owns streams
    ``r, r + W, r + 2W, ...`` as rows, padded with empty rows to ``ceil(num_streams / W)`` rows. Segment ``j``
    of a stream has input = bytes ``[j*T, j*T + T)`` and target = bytes ``[j*T + 1, j*T + T]``; positions past
    the stream end have input 0 and target :data:`IGNORE_INDEX`. ``reset`` is True on segment 0. Over all
    ranks every byte except the first of each stream is a target exactly once (:meth:`num_targets`).
    """

    def __init__(
        self, data: np.ndarray, seq_len: int, num_streams: int, rank: int = 0, world_size: int = 1
    ) -> None:
        if len(data) < 2 * num_streams:
            raise ValueError(
                f"{len(data)} bytes cannot be cut into {num_streams} streams of at least 2 bytes"
            )
        self.data = data
        self.seq_len = seq_len
        self.num_streams = num_streams
        bounds = np.arange(num_streams + 1, dtype=np.int64) * len(data) // num_streams
        rows = math.ceil(num_streams / world_size)
        owned = np.arange(rows) * world_size + rank
        real = owned < num_streams
        self.starts = np.where(real, bounds[np.minimum(owned, num_streams - 1)], 0)
        self.ends = np.where(real, bounds[np.minimum(owned + 1, num_streams)], 0)
        self.segments = math.ceil((int(np.diff(bounds).max()) - 1) / seq_len)

    @staticmethod
    def count_targets(split_size: int, num_streams: int) -> int:
        """Targets over the whole split: every byte but the first of each stream."""
        return split_size - num_streams

    def num_targets(self) -> int:
        """Targets over the whole split, all ranks together."""
        return self.count_targets(len(self.data), self.num_streams)

    def __len__(self) -> int:
        return self.segments

    def __iter__(self) -> Iterator[Batch]:
        offsets = np.arange(self.seq_len + 1)
        for segment in range(self.segments):
            positions = self.starts[:, None] + segment * self.seq_len + offsets
            valid = positions < self.ends[:, None]
            chunk = np.where(valid, self.data[np.where(valid, positions, 0)], 0).astype(np.int64)
            target = np.where(valid[:, 1:], chunk[:, 1:], IGNORE_INDEX)
            yield {
                "input": torch.from_numpy(np.ascontiguousarray(chunk[:, :-1])),
                "target": torch.from_numpy(target),
                "reset": torch.full((len(self.starts),), segment == 0, dtype=torch.bool),
            }


class TrainLoader:
    """The training "dataloader" handed to Lightning: iterates a sampler's batches.

    Lightning calls ``loader.sampler.set_epoch(epoch)`` each epoch and saves/restores
    ``state_dict``/``load_state_dict`` in checkpoints; ``len`` is known, so Lightning does not prefetch
    and the saved position is exactly the number of consumed batches.
    """

    def __init__(self, sampler: TrainSampler) -> None:
        self.sampler = sampler

    def __iter__(self) -> Iterator[Batch]:
        return iter(self.sampler)

    def __len__(self) -> int:
        return len(self.sampler)

    def state_dict(self) -> dict[str, Any]:
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state)
