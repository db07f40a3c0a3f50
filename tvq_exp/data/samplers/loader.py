"""What every training sampler shares: the batch of windows, the split-size check, the loader Lightning sees.

A sampler is an iterable of ready batches (:mod:`tvq_exp.batch`). Batches are built in the main process by
numpy fancy indexing (cheap), so no DataLoader workers are needed and the sampler's position is exact when
Lightning checkpoints it.
"""

from __future__ import annotations

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
