"""Random training windows."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from tvq_exp.batch import Batch
from tvq_exp.data.samplers.loader import check_split_size, window_batch


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
