"""The EMA update rule (the paper's and the official code's): codes are running means of their keys."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from tvq_exp.quantize.sync import all_reduce_sum
from tvq_exp.quantize.update import CodebookUpdate


def decay_into(average: Tensor, new: Tensor, decay: float | Tensor) -> None:
    """``average ← decay·average + (1 - decay)·new`` in place (``decay`` a number or a 0-d tensor)."""
    if isinstance(decay, Tensor):
        average.mul_(decay).add_(new * (1 - decay))
    else:
        average.mul_(decay).add_(new, alpha=1 - decay)


class EMAUpdate(CodebookUpdate):
    """``C = ema_sum / max(count, count_floor)``: per code an EMA of the sum of its keys (``ema_sum (H, S, d)``)
    over the EMA of their number (the quantiser's usage counts ``ema_count (H, S)``), both decayed with the
    quantiser's (possibly warming-up) decay once per optimiser step. ``smoothing > 0`` Laplace-smooths the
    counts in the read-out: ``(n + ε) / (Σn + S·ε) · Σn``. The codes get no gradient.

    State on the quantiser: ``embed`` and ``ema_sum`` (buffers), ``pending_sum`` (this step's key sums,
    all-reduced under DDP before use; not saved).
    """

    def __init__(self, smoothing: float = 0.0, count_floor: float = 0.01) -> None:
        self.smoothing, self.count_floor = smoothing, count_floor

    def create(self, owner: nn.Module, init: Tensor) -> None:
        owner.register_buffer("embed", init.clone())
        owner.register_buffer("ema_sum", init.clone())
        owner.register_buffer("pending_sum", torch.zeros_like(init), persistent=False)

    def codes(self, owner: nn.Module) -> Tensor:
        return owner.embed

    def assign(self, owner: nn.Module, mask: Tensor, vectors: Tensor) -> None:
        vectors = vectors.to(owner.embed.dtype)
        owner.embed.copy_(torch.where(mask[..., None], vectors, owner.embed))
        owner.ema_sum.copy_(torch.where(mask[..., None], vectors * owner.ema_count[..., None], owner.ema_sum))

    sums_keys = True

    def accumulate(self, owner: nn.Module, sums: Tensor) -> None:
        owner.pending_sum += sums

    def apply(self, owner: nn.Module, decay: float | Tensor) -> None:
        all_reduce_sum(owner.pending_sum)
        decay_into(owner.ema_sum, owner.pending_sum, decay)
        counts = owner.ema_count
        if self.smoothing > 0:
            total = counts.sum(-1, keepdim=True)
            counts = (counts + self.smoothing) / (total + counts.shape[-1] * self.smoothing) * total
        owner.embed.copy_(owner.ema_sum / counts.clamp_min(self.count_floor)[..., None])

    def discard(self, owner: nn.Module) -> None:
        owner.pending_sum.zero_()
