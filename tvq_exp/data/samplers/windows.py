"""Random training windows."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from tvq_exp.batch import Batch
from tvq_exp.data.samplers.loader import EpochSampler, check_split_size, window_batch


class RandomWindowSampler(EpochSampler):
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
        super().__init__(batch_size, seed, rank, world_size)
        self.data, self.seq_len, self.steps_per_epoch = data, seq_len, steps_per_epoch

    def __len__(self) -> int:
        return self.steps_per_epoch

    def epoch_batches(self, epoch: int, start: int) -> Iterator[Batch]:
        rng = np.random.default_rng([self.seed, self.rank, epoch])
        high = len(self.data) - self.seq_len
        for _ in range(start):
            rng.integers(0, high, size=self.batch_size)
        for _ in range(start, self.steps_per_epoch):
            yield window_batch(
                self.data, rng.integers(0, high, size=self.batch_size), self.seq_len, reset=True
            )
