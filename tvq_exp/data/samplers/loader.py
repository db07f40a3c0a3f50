"""What every training sampler shares: the batch of windows, the split-size check, the resumable position, the
loader Lightning sees.

A sampler is an iterable of ready batches (:mod:`tvq_exp.batch`). Batches are built in the main process by
numpy fancy indexing (cheap), so no DataLoader workers are needed and the sampler's position is exact when
Lightning checkpoints it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import Any, Protocol

import numpy as np
import torch

from tvq_exp.batch import Batch


def window_batch(data: np.ndarray, starts: np.ndarray, seq_len: int, reset: bool, position: int = 0) -> Batch:
    """Windows ``data[s : s + T + 1]`` for each start ``s``: input = first T bytes, target = last T bytes;
    ``position`` is the segment's distance (in tokens) from the last state reset."""
    chunk = torch.from_numpy(data[starts[:, None] + np.arange(seq_len + 1)].astype(np.int64))
    return {
        "input": chunk[:, :-1].contiguous(),
        "target": chunk[:, 1:].contiguous(),
        "reset": torch.full((len(starts),), reset, dtype=torch.bool),
        "position": torch.full((len(starts),), position, dtype=torch.long),
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


class EpochSampler(ABC):
    """A training sampler: this process's seeded share of the job (``batch_size`` rows a step for ``rank`` of
    ``world_size``, drawn from ``seed``) and its resumable position, ``epoch`` and ``step`` (the batches of it
    already yielded).

    A subclass says how many batches an epoch holds (``__len__``) and yields those of an epoch from a given
    step on (:meth:`epoch_batches`), drawing its order from its seed and the epoch alone; iterating goes on
    from the position (the next epoch once this one is done), so :meth:`state_dict` is all a resume needs.
    """

    def __init__(self, batch_size: int, seed: int, rank: int, world_size: int) -> None:
        self.batch_size, self.seed, self.rank, self.world_size = batch_size, seed, rank, world_size
        self.epoch = 0
        self.step = 0

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def epoch_batches(self, epoch: int, start: int) -> Iterator[Batch]:
        """The batches of ``epoch`` from step ``start`` to its end."""

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its first step (no-op when already in it, e.g. after a resume)."""
        if epoch != self.epoch:
            self.epoch, self.step = epoch, 0

    def __iter__(self) -> Iterator[Batch]:
        if self.step >= len(self):
            self.set_epoch(self.epoch + 1)
        start = self.step
        for step, batch in enumerate(self.epoch_batches(self.epoch, start), start + 1):
            self.step = step
            yield batch

    def state_dict(self) -> dict[str, Any]:
        """Position (epoch, step); the order is re-derived from the seed."""
        return {"epoch": self.epoch, "step": self.step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.step = int(state["epoch"]), int(state["step"])


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
