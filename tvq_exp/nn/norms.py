"""Normalisation layers shared by the blocks."""

from __future__ import annotations

import torch
from torch import Tensor


def rms_normalize(x: Tensor, eps: float = 1e-6) -> Tensor:
    """Scale-free RMS normalisation over the last dim (the GAU's query/key norm)."""
    return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps).to(x.dtype)
