"""Parameter initialisation as in the official Transformer-VQ code.

Every linear kernel ``N(0, 1/fan_in)`` (untruncated; the output projections too, no depth scaling; the XL
bias's sinusoid projection alike, fan-in = the sinusoid width), biases zero; norm gains one and ``u, v``
zero as their modules start them; codebooks as :class:`~tvq_exp.quantize.VectorQuantizer` starts them
(``N(0, 1/(H·S))``, counts one); embeddings as the decoder's ``embed_scale`` says (official: ``N(0, 1)``).
"""

from __future__ import annotations

import torch
from torch import nn


@torch.no_grad()
def official_init(module: nn.Module) -> None:
    """Re-initialise every ``nn.Linear`` below ``module`` (in place)."""
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=m.in_features**-0.5)
            if m.bias is not None:
                nn.init.zeros_(m.bias)


__all__ = ["official_init"]
