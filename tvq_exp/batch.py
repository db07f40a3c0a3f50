"""The data contract: what a data module offers the model, the validator and the callbacks
(:class:`DataContract`), and the batches it yields.

A batch is a dict of tensors, every row one sequence segment:

- ``input``: ``(B, T)`` int64 token ids;
- ``target``: ``(B, T)`` int64 next-token ids, :data:`IGNORE_INDEX` where no loss is taken (padding);
- ``reset``: ``(B,)`` bool, True where the row starts a new sequence (the carried state is dropped);
- ``position`` (optional): ``(B,)`` int64, the segment's first position counted from the last reset (the
  state's age), used to resolve the loss by position;
- ``bucket`` (data with answer buckets: the synthetic probes): ``(B, T)`` int64, the answer bucket id at every
  answer position (``target != IGNORE_INDEX``), -1 elsewhere; the ids index
  :meth:`DataContract.bucket_names`.

Losses are in nats per target; bits per byte (or per dim for images) = nats / ln 2.
"""

from __future__ import annotations

import enum
from typing import Protocol, runtime_checkable

import torch

IGNORE_INDEX = -100  # torch's cross_entropy default: targets that take no loss

Batch = dict[str, torch.Tensor]


class DataKind(enum.StrEnum):
    """What the tokens are: bytes of text, sub-pixels of images (scored in bits/dim), or a synthetic probe
    (scored by accuracy at its answer positions too)."""

    TEXT = "text"
    IMAGE = "image"
    SYNTHETIC = "synthetic"


@runtime_checkable
class DataContract(Protocol):
    """What every data module (:class:`tvq_exp.data.module.RootedDataModule`) offers beyond Lightning's hooks.

    Attributes: ``kind`` (:class:`DataKind`), ``vocab_size`` (token ids are ``0 .. vocab_size - 1``),
    ``seq_len`` (``T`` of a training batch row), ``batch_size`` and ``eval_batch_size`` (rows per rank).
    """

    kind: DataKind
    vocab_size: int
    seq_len: int
    batch_size: int
    eval_batch_size: int

    @property
    def context_len(self) -> int:
        """Positions a model sees from a fresh state in training (a row, a TBPTT sequence, a stream)."""
        ...

    def bucket_names(self, split: str) -> list[str]:
        """The name of each answer bucket id of ``split``'s batches (their ``bucket`` key); empty when the
        batches have no ``bucket`` key (text, images)."""
        ...

    def check_accumulation(self, accumulate_grad_batches: int) -> None:
        """Raise :class:`~tvq_exp.options.OptionError` when the batches cannot be accumulated (consecutive
        batches continue the same sequences)."""
        ...


__all__ = ["IGNORE_INDEX", "Batch", "DataContract", "DataKind"]
