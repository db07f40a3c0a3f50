"""Evaluation metrics: bits per token over a whole split, resolved by position.

Sums are float64 and reduced over ranks (``dist_reduce_fx="sum"``), so a metric over a split split across
processes equals the single-process one.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torchmetrics import Metric

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
                {"start": start, "end": end, "tokens": int(self.tokens[k]), "loss": bucket_loss, "bpb": bucket_loss / math.log(2)}
            )
        return {"loss": loss, "bpb": loss / math.log(2), "tokens": int(tokens), "buckets": buckets}


__all__ = ["BUCKETS", "PositionBits", "bucket_edges", "position_bucket"]
