"""The affine (SimVQ) update rule: codes are a frozen random basis times a learnt linear map."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from tvq_exp.quantize.update import CodebookUpdate


class AffineUpdate(CodebookUpdate):
    """``C = basis @ proj``: ``basis (H, S, d)`` is frozen (a buffer: the random initial codes), ``proj
    (H, d, d)`` a parameter starting at the identity and trained by the codebook loss (SimVQ, Zhu et al.
    2024). Every code moves with ``proj``, so a code no key picks still follows the keys' space.

    :meth:`assign` (k-means init, re-seeding) sets basis rows to ``vectors @ pinv(proj)``, so the new
    codes equal ``vectors`` while ``proj`` stays invertible.
    """

    trainable = True

    def create(self, owner: nn.Module, init: Tensor) -> None:
        owner.register_buffer("basis", init.clone())
        owner.proj = nn.Parameter(torch.eye(init.shape[-1]).expand(init.shape[0], -1, -1).clone())

    def codes(self, owner: nn.Module) -> Tensor:
        return owner.basis @ owner.proj

    def assign(self, owner: nn.Module, mask: Tensor, vectors: Tensor) -> None:
        inverse = torch.linalg.pinv(owner.proj.detach().float())
        rows = (vectors.float() @ inverse).to(owner.basis.dtype)
        owner.basis.copy_(torch.where(mask[..., None], rows, owner.basis))
