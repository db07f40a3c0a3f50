"""Normalisation layers shared by the blocks."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from tvq_exp.options import PositiveFloat, PositiveInt, checked


def rms_normalize(x: Tensor, eps: float = 1e-6) -> Tensor:
    """Scale-free RMS normalisation over the last dim (the GAU's query/key norm), computed in fp32."""
    return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps).to(x.dtype)


class RMSNorm(nn.Module):
    """RMS norm with a learned gain and (optionally) a bias, as the official Transformer-VQ code's input and
    final norms: ``x / sqrt(mean(x²) + eps) · g + b`` (no centring; statistics in fp32).

    Shapes: ``x (..., dim)`` -> ``(..., dim)``.
    """

    @checked
    def __init__(self, dim: PositiveInt, eps: PositiveFloat = 1e-6, bias: bool = True) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        y = rms_normalize(x, self.eps) * self.weight.to(x.dtype)
        return y if self.bias is None else y + self.bias.to(x.dtype)


__all__ = ["RMSNorm", "rms_normalize"]
