"""What every data module shares: the data contract (:class:`tvq_exp.batch.DataContract`), the data root and
the process's rank.

Construction is cheap (no file access): downloads happen in ``prepare_data`` and files are read in
``setup``. Batches follow :mod:`tvq_exp.batch`.
"""

from __future__ import annotations

import os
from pathlib import Path

import lightning as L

from tvq_exp.batch import DataKind
from tvq_exp.data.paths import data_root


class RootedDataModule(L.LightningDataModule):
    """Shared plumbing: the data root and the (rank, world size) of this process; the data contract's keys
    (:class:`~tvq_exp.batch.DataContract`: ``kind``, ``seq_len``, ``vocab_size``, ``batch_size``,
    ``eval_batch_size``) and its defaults: no answer buckets, any gradient accumulation. Subclasses add
    ``context_len``."""

    def __init__(
        self,
        root: str | os.PathLike[str] | None,
        kind: str,
        seq_len: int,
        vocab_size: int,
        batch_size: int,
        eval_batch_size: int,
    ) -> None:
        super().__init__()
        self.root_override = root
        self.kind = DataKind(kind)
        self.seq_len, self.vocab_size = seq_len, vocab_size
        self.batch_size, self.eval_batch_size = batch_size, eval_batch_size

    def bucket_names(self, split: str) -> list[str]:
        """No answer buckets (the batches carry no ``bucket`` key); the probes override it."""
        return []

    def check_accumulation(self, accumulate_grad_batches: int) -> None:
        """Any gradient accumulation is fine (independent rows); streamed or TBPTT data refuse it."""

    @property
    def root(self) -> Path:
        """The data root, resolved when used (``root`` arg, else ``$TVQ_DATA_DIR``, else ``./data``)."""
        return data_root(self.root_override)

    def distributed(self) -> tuple[int, int]:
        """``(global_rank, world_size)`` from the attached trainer, else ``(0, 1)``."""
        if self.trainer is None:
            return 0, 1
        return self.trainer.global_rank, self.trainer.world_size
