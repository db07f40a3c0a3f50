"""Evaluation metrics: bits per token over a whole split resolved by position, and accuracy at answer
positions (the synthetic probes) resolved by bucket.

Sums are float64 and reduced over ranks (``dist_reduce_fx="sum"``), so a metric over a split split across
processes equals the single-process one.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torchmetrics import Metric

from tvq_exp.batch import IGNORE_INDEX
from tvq_exp.options import PositiveInt, checked

BUCKETS = 40  # log-spaced position buckets: [0, u), [u, 2u), [2u, 4u), ... up to u·2^38


def position_bucket(positions: Tensor, unit: int) -> Tensor:
    """The bucket of each position (tokens since the last state reset): ``0`` for ``[0, u)``, then
    ``k >= 1`` for ``[u·2^(k-1), u·2^k)``."""
    scaled = positions.div(unit, rounding_mode="floor")
    bucket = torch.where(scaled > 0, torch.floor(torch.log2(scaled.clamp_min(1).double())).long() + 1, 0)
    return bucket.clamp_max(BUCKETS - 1)


def bucket_edges(bucket: int, unit: int) -> tuple[int, int]:
    """``[start, end)`` in tokens of ``bucket``."""
    return (0, unit) if bucket == 0 else (unit * 2 ** (bucket - 1), unit * 2**bucket)


class PositionBits(Metric):
    """Nats and targets summed over a split, in total and per position bucket (log-spaced in units of
    ``unit`` tokens, counted from the last state reset: :func:`position_bucket`).

    ``update(nats (B, T), mask (B, T) bool, positions (B, T) int64)``; :meth:`compute` returns
    ``{"loss", "bpb", "tokens", "buckets": [{"start", "end", "tokens", "loss", "bpb"}, ...]}`` (buckets
    with targets only). The token-weighted mean of the buckets' bits is the total (nothing is left out).
    """

    full_state_update = False

    def __init__(self, unit: int) -> None:
        super().__init__()
        self.unit = int(unit)
        self.add_state("nats", torch.zeros(BUCKETS, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("tokens", torch.zeros(BUCKETS, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, nats: Tensor, mask: Tensor, positions: Tensor) -> None:
        bucket = position_bucket(positions[mask], self.unit)
        self.nats.index_add_(0, bucket, nats[mask].double())
        self.tokens.index_add_(0, bucket, torch.ones_like(bucket, dtype=torch.float64))

    def compute(self) -> dict[str, object]:
        nats, tokens = float(self.nats.sum()), float(self.tokens.sum())
        loss = nats / max(tokens, 1.0)
        buckets = []
        for k in torch.nonzero(self.tokens).flatten().tolist():
            start, end = bucket_edges(k, self.unit)
            bucket_loss = float(self.nats[k] / self.tokens[k])
            buckets.append(
                {
                    "start": start,
                    "end": end,
                    "tokens": int(self.tokens[k]),
                    "loss": bucket_loss,
                    "bpb": bucket_loss / math.log(2),
                }
            )
        return {"loss": loss, "bpb": loss / math.log(2), "tokens": int(tokens), "buckets": buckets}


def _ratio(numerator: torch.Tensor, denominator: torch.Tensor) -> torch.Tensor:
    """``numerator / denominator`` in float64; NaN where the denominator is 0."""
    return numerator.double() / denominator.double()


class BucketAccuracy(Metric):
    """Accuracy (and bits) counted only at answer positions (``target != ignore_index``), overall and per bucket.

    :meth:`update` takes ``preds`` (predicted ids), ``target`` and ``bucket`` (the batch's bucket ids, in
    ``[0, num_buckets)`` at every answer position), all ``(B, T)`` integer tensors, and ``nats`` ``(B, T)``, the
    loss at every position, for the bits per answer token per bucket.
    Counts are int64 sums and the nats float64 sums (``dist_reduce_fx="sum"``), so the result is the same on
    one process or many.

    Sequence accuracy: a row counts as right when all its answer positions are right (rows without answer
    positions are not counted); per bucket, the unit is a (row, bucket) group, right when all the row's
    answer positions in that bucket are right (for passkey, one row = one cell, so this is the per-cell
    example accuracy).
    """

    full_state_update = False
    is_differentiable = False
    higher_is_better = True

    @checked
    def __init__(
        self, num_buckets: PositiveInt = 1, ignore_index: int = IGNORE_INDEX, **kwargs: object
    ) -> None:
        super().__init__(**kwargs)
        self.num_buckets = num_buckets
        self.ignore_index = ignore_index
        for name in ("correct", "total", "group_correct", "group_total"):
            self.add_state(name, default=torch.zeros(num_buckets, dtype=torch.int64), dist_reduce_fx="sum")
        for name in ("row_correct", "row_total"):
            self.add_state(name, default=torch.zeros((), dtype=torch.int64), dist_reduce_fx="sum")
        self.add_state("nats", default=torch.zeros(num_buckets, dtype=torch.float64), dist_reduce_fx="sum")

    def update(
        self, preds: torch.Tensor, target: torch.Tensor, bucket: torch.Tensor, nats: torch.Tensor
    ) -> None:
        """Accumulate one batch: ``preds``, ``target``, ``bucket`` and ``nats`` (the loss), all ``(B, T)``."""
        if any(x.shape != target.shape for x in (preds, bucket, nats)) or target.dim() != 2:
            raise ValueError(
                f"preds, target, bucket and nats must all be (B, T); got {tuple(preds.shape)}, "
                f"{tuple(target.shape)}, {tuple(bucket.shape)}, {tuple(nats.shape)}"
            )
        answer = target != self.ignore_index
        buckets = bucket[answer]
        if buckets.numel() and (int(buckets.min()) < 0 or int(buckets.max()) >= self.num_buckets):
            raise ValueError(f"bucket ids at answer positions must be in [0, {self.num_buckets})")
        right = (preds == target)[answer]
        self.total += torch.bincount(buckets, minlength=self.num_buckets)
        self.correct += torch.bincount(buckets[right], minlength=self.num_buckets)
        self.nats += torch.bincount(buckets, nats[answer].double(), minlength=self.num_buckets)
        self._update_groups(answer, buckets, right)

    def _update_groups(self, answer: torch.Tensor, buckets: torch.Tensor, right: torch.Tensor) -> None:
        """Sequence counts from the answer mask ``(B, T)`` and the answers' buckets and rightness ``(n,)``."""
        rows = answer.nonzero()[:, 0]
        size = answer.shape[0] * self.num_buckets
        group = rows * self.num_buckets + buckets
        answers = torch.bincount(group, minlength=size).view(-1, self.num_buckets)
        wrong = torch.bincount(group[~right], minlength=size).view(-1, self.num_buckets)
        present = answers > 0
        self.group_total += present.sum(0)
        self.group_correct += (present & (wrong == 0)).sum(0)
        row_present = present.any(1)
        self.row_total += row_present.sum()
        self.row_correct += (row_present & (wrong.sum(1) == 0)).sum()

    def compute(self) -> dict[str, torch.Tensor]:
        """``accuracy`` (scalar), ``bucket_accuracy`` ``(K,)``, ``bucket_count`` ``(K,)`` answers seen,
        ``sequence_accuracy`` (scalar), ``bucket_sequence_accuracy`` ``(K,)`` and ``bucket_bpb`` ``(K,)`` (bits per
        answer token); float64, NaN where empty."""
        return {
            "accuracy": _ratio(self.correct.sum(), self.total.sum()),
            "bucket_accuracy": _ratio(self.correct, self.total),
            "bucket_count": self.total.clone(),
            "sequence_accuracy": _ratio(self.row_correct, self.row_total),
            "bucket_sequence_accuracy": _ratio(self.group_correct, self.group_total),
            "bucket_bpb": _ratio(self.nats, self.total) / math.log(2),
        }


__all__ = ["BUCKETS", "BucketAccuracy", "PositionBits", "bucket_edges", "position_bucket"]
