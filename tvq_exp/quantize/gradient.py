"""The gradient update rule: the codes are a parameter trained by the codebook loss."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from tvq_exp.quantize.update import CodebookUpdate


class GradientUpdate(CodebookUpdate):
    """Codes ``embed (H, S, d)`` are an ``nn.Parameter`` trained by the optimiser through the quantiser's
    codebook loss ``codebook_weight·mean ||C_z - sg(k)||²`` (VQ-VAE); no EMA of key sums."""

    trainable = True

    def create(self, owner: nn.Module, init: Tensor) -> None:
        owner.embed = nn.Parameter(init.clone())

    def codes(self, owner: nn.Module) -> Tensor:
        return owner.embed

    def assign(self, owner: nn.Module, mask: Tensor, vectors: Tensor) -> None:
        data = owner.embed.data
        data.copy_(torch.where(mask[..., None], vectors.to(data.dtype), data))
