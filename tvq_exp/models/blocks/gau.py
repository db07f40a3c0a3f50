"""Gated Attention Unit (Hua et al. 2022) as used by Transformer-VQ."""

from __future__ import annotations

from typing import Annotated

import torch.nn.functional as F
from torch import Tensor, nn

from tvq_exp.attention.base import Aux
from tvq_exp.measure.flops import mm, with_backward
from tvq_exp.models.blocks.common import (
    POSITIONS,
    AttentionFactory,
    BlockState,
    build_block_attention,
    rotate,
)
from tvq_exp.nn.dropout import StochasticDepth
from tvq_exp.nn.norms import RMSNorm, rms_normalize
from tvq_exp.options import AtLeast, Between, OneOf, OptionError, checked


class GAUBlock(nn.Module):
    """Pre-norm GAU, as the official Transformer-VQ code: ``x + LayerDrop(Dropout(W_o(attn(q, k, v) ⊙ g)))``.

    ``h = RMSNorm(x)`` (gain and bias, eps 1e-6); ``q = RMS(hW_q)·d_k^-1/4``, ``k = RMS(hW_k)·d_k^-1/4``,
    ``v = SiLU(hW_v)``, ``g = SiLU(hW_g)`` with ``d_v = expansion·d_model`` split over ``heads``. Residual
    dropout is applied once, to the branch's output; LayerDrop drops the branch per example for the whole
    sequence (its mask is carried in the state). The XL bias's sinusoids are ``sinusoid_dim`` wide (default
    ``d_model``) and ``sinusoid_dropout`` drops their entries.

    Shapes: ``x (B, T, d_model)`` -> ``(B, T, d_model)``; state: a :class:`BlockState`.
    """

    @checked
    def __init__(
        self,
        d_model: Annotated[int, AtLeast(1)],
        attention: AttentionFactory,
        d_k: Annotated[int, AtLeast(1)] = 128,
        expansion: Annotated[int, AtLeast(1)] = 2,
        heads: Annotated[int, AtLeast(1)] = 1,
        position: Annotated[str, OneOf(*POSITIONS)] = "xl",
        dropout: Annotated[float, Between(0, 1, "[)")] = 0.0,
        layerdrop: Annotated[float, Between(0, 1, "[)")] = 0.0,
        sinusoid_dropout: Annotated[float, Between(0, 1, "[)")] = 0.0,
        sinusoid_dim: Annotated[int, AtLeast(2)] | None = None,
    ) -> None:
        super().__init__()
        d_v = expansion * d_model
        if d_v % heads:
            raise OptionError("heads", heads, f"must divide expansion*d_model={d_v}", type(self))
        self.d_model, self.expansion, self.heads, self.d_k, self.d_v = d_model, expansion, heads, d_k, d_v
        self.position = position
        self.norm = RMSNorm(d_model)
        self.w_qk = nn.Linear(d_model, 2 * heads * d_k, bias=False)
        self.w_vg = nn.Linear(d_model, 2 * d_v, bias=False)
        self.w_o = nn.Linear(d_v, d_model, bias=False)
        self.attn = build_block_attention(
            attention, position, d_k, d_v // heads, heads, sinusoid_dim or d_model, sinusoid_dropout
        )
        self.dropout = nn.Dropout(dropout)
        self.layerdrop = StochasticDepth(layerdrop)

    def flops(self, seq_len: int, batch: int = 1, backward: bool = False) -> int | None:
        """Projections ``W_qk, W_vg, W_o`` plus the attention's (``None`` when it has no formula):
        ``2T·d_model·(2H·d_k + 2d_v) + 2T·d_v·d_model`` per sequence besides the attention."""
        attn = self.attn.flops(seq_len, batch, backward)
        if attn is None:
            return None
        d_model, d_v = self.d_model, self.d_v
        proj = (
            mm(seq_len, 2 * self.heads * self.d_k, d_model)
            + mm(seq_len, 2 * d_v, d_model)
            + mm(seq_len, d_model, d_v)
        )
        return attn + with_backward(batch * proj, backward)

    def forward(self, x: Tensor, state: BlockState | None = None) -> tuple[Tensor, BlockState, Aux]:
        b, t, _ = x.shape
        h = self.norm(x)
        scale = self.d_k**-0.25
        q, k = self.w_qk(h).view(b, t, 2, self.heads, self.d_k).permute(2, 0, 3, 1, 4)
        q, k = rms_normalize(q) * scale, rms_normalize(k) * scale
        v, g = F.silu(self.w_vg(h)).chunk(2, dim=-1)
        v = v.view(b, t, self.heads, -1).transpose(1, 2)
        t0 = 0 if state is None else state.position
        q, k = rotate(q, k, t0, self.position)
        o, attn_state, aux = self.attn(q, k, v, None if state is None else state.attn)
        o = o.transpose(1, 2).reshape(b, t, self.d_v)
        out, keep = self.layerdrop(self.dropout(self.w_o(o * g)), None if state is None else state.keep)
        return x + out, BlockState(t0 + t, attn_state, keep), aux
