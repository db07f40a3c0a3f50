"""Dead-code re-seeding with a threshold relative to a code's fair share of the keys."""

from __future__ import annotations

import torch
from torch import Tensor

from tvq_exp.quantize.sync import broadcast_from_rank0


def dead_codes(counts: Tensor, fraction: float) -> Tensor:
    """Codes used less than ``fraction`` of their fair share: ``counts (H, S)`` (the keys each code took in
    one optimiser step, or one batch) -> ``(H, S)`` bool, ``counts < fraction · N / S`` with ``N = Σ_s counts``.

    Relative to the keys actually seen, the test is free of the batch size, of ``S`` and of any initial
    value of the usage statistics, and it sees a code that lost its keys at once, not after the usage EMA
    has decayed (``log(fraction) / log(decay)`` steps: 230 at 0.1 and 0.99).
    """
    return counts < fraction * counts.mean(-1, keepdim=True)


def sample_rows(keys: Tensor, num: int) -> Tensor:
    """``num`` keys drawn uniformly per head from ``keys (H, N, d)`` (without replacement while ``N >= num``):
    ``(H, num, d)``, identical on every rank (rank 0's draw)."""
    h, n, d = keys.shape
    if n >= num:
        pick = torch.rand(h, n, device=keys.device).argsort(-1)[:, :num]
    else:
        pick = torch.randint(0, n, (h, num), device=keys.device)
    return broadcast_from_rank0(torch.gather(keys, 1, pick[..., None].expand(h, num, d)).contiguous())


__all__ = ["dead_codes", "sample_rows"]
