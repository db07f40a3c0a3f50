"""Gated Attention Unit (Hua et al. 2022) as used by Transformer-VQ."""

from __future__ import annotations

from typing import Annotated, Unpack

import torch.nn.functional as F
from torch import Tensor, nn

from tvq_exp.attention.base import Aux
from tvq_exp.measure.flops import mm
from tvq_exp.models.blocks.common import BlockOptions, BlockState, ResidualBlock
from tvq_exp.nn.norms import RMSNorm, rms_normalize
from tvq_exp.options import OneOf, OptionError, PositiveInt, checked


class GAUBlock(ResidualBlock):
    """Pre-norm GAU, as the official Transformer-VQ code: ``x + LayerDrop(Dropout(W_o(attn(q, k, v) ⊙ g)))``.

    ``h = RMSNorm(x)`` (gain and bias, eps 1e-6); ``q = RMS(hW_q)·d_k^-1/4``, ``k = RMS(hW_k)·d_k^-1/4``,
    ``v = SiLU(hW_v)``, ``g = SiLU(hW_g)`` with ``d_v = expansion·d_model`` split over ``heads``.
    ``key_norm="unit"`` l2-normalises the keys instead, ``k = hW_k/||hW_k||`` (norm 1 rather than
    ``d_k^1/4``): the keys of the cosine codebook (``codebook.normalize=true``), so a dense model can be given
    them; every score is then ``d_k^-1/4`` times the official one (a lower attention temperature). Residual
    dropout is applied once, to the branch's output. The options every block shares (``position``, dropout,
    LayerDrop, the XL bias's sinusoids): :class:`~tvq_exp.models.blocks.common.ResidualBlock`.

    Shapes: ``x (B, T, d_model)`` -> ``(B, T, d_model)``; state: a :class:`BlockState`.
    """

    @checked
    def __init__(
        self,
        *,
        d_k: PositiveInt = 128,
        expansion: PositiveInt = 2,
        heads: PositiveInt = 1,
        key_norm: Annotated[str, OneOf("rms", "unit")] = "rms",
        **options: Unpack[BlockOptions],
    ) -> None:
        super().__init__(**options)
        d_model = self.d_model
        d_v = expansion * d_model
        if d_v % heads:
            raise OptionError("heads", heads, f"must divide expansion*d_model={d_v}", type(self))
        self.expansion, self.heads, self.d_k, self.d_v = expansion, heads, d_k, d_v
        self.key_norm = key_norm
        self.norm = RMSNorm(d_model)
        self.w_qk = nn.Linear(d_model, 2 * heads * d_k, bias=False)
        self.w_vg = nn.Linear(d_model, 2 * d_v, bias=False)
        self.w_o = nn.Linear(d_v, d_model, bias=False)
        self.attn = self.build_attention(d_k, d_v // heads, heads)

    def projection_flops(self, seq_len: int) -> int:
        """``W_qk, W_vg, W_o``: ``2T·d_model·(2H·d_k + 2d_v) + 2T·d_v·d_model``."""
        d_model, d_v = self.d_model, self.d_v
        return (
            mm(seq_len, 2 * self.heads * self.d_k, d_model)
            + mm(seq_len, 2 * d_v, d_model)
            + mm(seq_len, d_model, d_v)
        )

    def forward(self, x: Tensor, state: BlockState | None = None) -> tuple[Tensor, BlockState, Aux]:
        b, t, _ = x.shape
        h = self.norm(x)
        scale = self.d_k**-0.25
        q, k = self.w_qk(h).view(b, t, 2, self.heads, self.d_k).permute(2, 0, 3, 1, 4)
        q = rms_normalize(q) * scale
        k = F.normalize(k, dim=-1) if self.key_norm == "unit" else rms_normalize(k) * scale
        # SiLU per half: compiled, each fuses with its half's reader forward and its gradient's writer backward (over
        # the whole projection, the backward joined the halves' gradients into a buffer before SiLU's own)
        v, g = (F.silu(x) for x in self.w_vg(h).chunk(2, dim=-1))
        v = v.view(b, t, self.heads, -1).transpose(1, 2)
        o, attn_state, last_key, aux = self.attend(q, k, v, state)
        o = o.transpose(1, 2).reshape(b, t, self.d_v)
        out, keep = self.residual(self.w_o(o * g), state)
        return x + out, self.next_state(state, t, attn_state, keep, last_key), aux
