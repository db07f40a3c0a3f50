"""LayerDrop (stochastic depth) on residual branches."""

from __future__ import annotations

from typing import Annotated

import torch
from torch import Tensor, nn

from tvq_exp.options import Between, checked


class StochasticDepth(nn.Module):
    """LayerDrop on a residual branch: drops the branch per sample with probability ``p`` (training).

    The branch is still computed, so carried attention state stays consistent. ``x: (B, ...)``.
    """

    @checked
    def __init__(self, p: Annotated[float, Between(0, 1, "[)")] = 0.0) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0.0:
            return x
        keep = torch.rand(x.shape[0], *([1] * (x.dim() - 1)), device=x.device) >= self.p
        return x * keep.to(x.dtype) / (1.0 - self.p)
