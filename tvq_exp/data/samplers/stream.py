"""Transformer-XL style contiguous streams with the state carried from one step to the next."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import numpy as np

from tvq_exp.batch import Batch
from tvq_exp.data.samplers.loader import EpochSampler, check_split_size, window_batch


class StreamSampler(EpochSampler):
    """Transformer-XL style contiguous streams.

    The training split (after a random start offset in ``[0, T)`` drawn once per epoch) is cut into
    ``batch_size * world_size`` equal streams of length ``L``; rank ``r`` owns streams
    ``r*B ... r*B + B - 1``. Step ``j`` yields bytes ``[j*T, j*T + T]`` of each owned stream, so row ``b`` of
    step ``j + 1`` continues row ``b`` of step ``j``.

    Bounded context: ``reset`` is True on step 0 of each epoch and then every ``reset_every`` tokens
    (rounded up to whole segments of ``T``), so the carried state never grows older than that: a
    compressive cache that counts every key since the stream began, or a linear attention's normaliser,
    otherwise sees ever larger counts, and validation (from a fresh state) no longer matches training.
    ``reset_every=None`` carries the state through the whole epoch. ``state_dict`` holds the position and
    the offset generator's state so a resume continues exactly.
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
        reset_every: int | None = None,
    ) -> None:
        check_split_size("train", len(data), seq_len)
        super().__init__(batch_size, seed, rank, world_size)
        self.reset_segments = None if reset_every is None else max(1, -(-reset_every // seq_len))
        num_streams = batch_size * world_size
        self.stream_len = (len(data) - (seq_len - 1 if random_offset else 0)) // num_streams
        self.steps = (self.stream_len - 1) // seq_len
        if self.steps < 1:
            raise ValueError(
                f"split 'train' has {len(data)} bytes: too few for {num_streams} streams of at least "
                f"seq_len + 1 = {seq_len + 1} bytes; lower batch_size or seq_len"
            )
        self.data, self.seq_len, self.random_offset = data, seq_len, random_offset
        self.rng = np.random.default_rng(seed)
        self.offset: int | None = None

    def __len__(self) -> int:
        return self.steps

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its first step with a fresh offset (no-op when already in it)."""
        if epoch != self.epoch:
            super().set_epoch(epoch)
            self.offset = None

    def stream_starts(self) -> np.ndarray:
        """Start index of each stream owned by this rank, ``(B,)``, for the current epoch's offset."""
        if self.offset is None:
            self.offset = int(self.rng.integers(self.seq_len)) if self.random_offset else 0
        streams = self.rank * self.batch_size + np.arange(self.batch_size)
        return self.offset + streams * self.stream_len

    def epoch_batches(self, epoch: int, start: int) -> Iterator[Batch]:
        """Steps ``start ..`` of the current epoch (its offset is drawn on first use, then kept)."""
        starts = self.stream_starts()
        for step in range(start, self.steps):
            age = (
                step if self.reset_segments is None else step % self.reset_segments
            )  # segments since a reset
            yield window_batch(
                self.data,
                starts + step * self.seq_len,
                self.seq_len,
                reset=age == 0,
                position=age * self.seq_len,
            )

    def state_dict(self) -> dict[str, Any]:
        """Epoch, step, this epoch's offset and the offset generator (JSON, safe for ``weights_only`` loads)."""
        return {
            **super().state_dict(),
            "offset": self.offset,
            "rng": json.dumps(self.rng.bit_generator.state),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.offset = None if state["offset"] is None else int(state["offset"])
        self.rng.bit_generator.state = json.loads(state["rng"])
