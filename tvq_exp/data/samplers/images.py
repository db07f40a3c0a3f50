"""Training batches of whole images in a seeded order, optionally cut into TBPTT updates.

Each epoch the training images are permuted (``default_rng([seed, epoch])``) and dealt out to the ranks
(rank ``r`` takes every ``world_size``-th image from ``r``: disjoint); batches of ``batch_size`` follow (the
remainder is dropped). With ``update_len`` (a divisor of the image's ``T`` tokens) every batch is yielded as
``T / update_len`` consecutive updates with ``reset`` True at the first, as the official code walks each
ImageNet64 image in 1536-token updates with the state carried. ``state_dict`` is ``(epoch, step)``: a
resume continues exactly, mid-image too.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch
from torch.utils.data import Dataset, default_collate

from tvq_exp.batch import Batch
from tvq_exp.data.samplers.loader import EpochSampler


class ImageSampler(EpochSampler):
    """Seeded, resumable training batches over a map-style image token dataset (see the module docstring).

    Batches: ``input``, ``target`` ``(B, U)`` (``U = update_len`` or the whole image), ``reset`` ``(B,)``,
    ``position`` ``(B,)`` (the update's offset in the image).
    """

    def __init__(
        self,
        dataset: Dataset[Batch],
        tokens: int,
        batch_size: int,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        update_len: int | None = None,
    ) -> None:
        update_len = update_len or tokens
        if tokens % update_len:
            raise ValueError(f"update_len={update_len} must divide the image's {tokens} tokens")
        super().__init__(batch_size, seed, rank, world_size)
        self.dataset, self.update_len = dataset, update_len
        self.updates = tokens // update_len
        self.batches = len(dataset) // (batch_size * world_size)  # type: ignore[arg-type]
        if self.batches < 1:
            raise ValueError(
                f"{len(dataset)} training images are too few for batches of {batch_size * world_size}"
            )  # type: ignore[arg-type]

    def __len__(self) -> int:
        return self.batches * self.updates

    def order(self, epoch: int) -> np.ndarray:
        """This rank's images of ``epoch``, batch after batch: ``(batches, B)``."""
        order = np.random.default_rng([self.seed, epoch]).permutation(len(self.dataset))  # type: ignore[arg-type]
        return order[self.rank :: self.world_size][: self.batches * self.batch_size].reshape(self.batches, -1)

    def epoch_batches(self, epoch: int, start: int) -> Iterator[Batch]:
        """The updates of ``epoch`` from update ``start`` on (a step is one update)."""
        order = self.order(epoch)
        whole: Batch | None = None
        for step in range(start, len(self)):
            batch, update = divmod(step, self.updates)
            if whole is None or update == 0:
                whole = default_collate([self.dataset[int(i)] for i in order[batch]])
            cut = slice(update * self.update_len, (update + 1) * self.update_len)
            yield {
                "input": whole["input"][:, cut],
                "target": whole["target"][:, cut],
                "reset": torch.full((self.batch_size,), update == 0, dtype=torch.bool),
                "position": torch.full((self.batch_size,), update * self.update_len, dtype=torch.long),
            }


__all__ = ["ImageSampler"]
