"""LayerDrop (stochastic depth) on residual branches, one draw per example and sequence."""

from __future__ import annotations

from typing import Annotated

import torch
from torch import Tensor, nn

from tvq_exp.options import Between, checked


class StochasticDepth(nn.Module):
    """LayerDrop on a residual branch: drops the branch per example with probability ``p`` (training), the
    kept ones scaled by ``1 / (1 - p)``.

    As in the official code ("timeless" masks), an example's draw holds for its whole sequence: the mask is
    drawn when a sequence starts (``keep=None``) and returned, so the block carries it in its state to the
    next TBPTT update of the same sequence. The branch is still computed, so the carried attention state
    stays consistent.

    ``forward(x (B, ...), keep (B,) bool | None) -> (x', keep)``.
    """

    @checked
    def __init__(self, p: Annotated[float, Between(0, 1, "[)")] = 0.0) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: Tensor, keep: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        if not self.training or self.p == 0.0:
            return x, keep
        if keep is None or keep.shape[0] != x.shape[0]:
            keep = torch.rand(x.shape[0], device=x.device) >= self.p
        scale = keep.to(x.dtype).view(-1, *([1] * (x.dim() - 1))) / (1.0 - self.p)
        return x * scale, keep
