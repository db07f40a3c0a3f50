"""Multi-head attention block with a GLU feed-forward."""

from __future__ import annotations

from typing import Unpack

import torch.nn.functional as F
from torch import Tensor, nn

from tvq_exp.attention.base import Aux
from tvq_exp.measure.flops import mm
from tvq_exp.models.blocks.common import BlockOptions, BlockState, ResidualBlock
from tvq_exp.nn.norms import RMSNorm, rms_normalize
from tvq_exp.options import OptionError, PositiveFloat, PositiveInt, checked


def glu_hidden(d_model: int, ff_mult: float) -> int:
    """Hidden width of the SwiGLU feed-forward, ``int(ff_mult·d_model·2/3)``: as many weights as a plain
    MLP ``ff_mult`` times as wide as the model."""
    return int(ff_mult * d_model * 2 / 3)


class GLUFeedForward(nn.Module):
    """SwiGLU feed-forward: ``W_2(SiLU(xW_g) ⊙ xW_1)``; ``(B, T, d) -> (B, T, d)``."""

    def __init__(self, d_model: int, hidden: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.w_in = nn.Linear(d_model, 2 * hidden, bias=False)
        self.w_out = nn.Linear(hidden, d_model, bias=False)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        a, g = self.w_in(x).chunk(2, dim=-1)
        return self.w_out(self.dropout(a * F.silu(g)))


class MHABlock(ResidualBlock):
    """Pre-norm multi-head attention + GLU feed-forward.

    ``key_size`` (per-head ``d_k``) is independent of ``head_size`` (per-head ``d_v``); ``kv_heads``
    groups keys/values (multi-query when 1). ``q·kᵀ`` is scaled by ``key_size^-1/2``, split evenly
    between ``q`` and ``k``; with ``qk_norm`` both are RMS-normalised first (keeps VQ codebooks stable). Dropout
    and LayerDrop (one mask for both branches) act on each residual branch; the options every block shares:
    :class:`~tvq_exp.models.blocks.common.ResidualBlock`.

    Shapes: ``x (B, T, d_model)`` -> ``(B, T, d_model)``; state: a :class:`BlockState`.
    """

    @checked
    def __init__(
        self,
        *,
        heads: PositiveInt = 4,
        head_size: PositiveInt | None = None,
        key_size: PositiveInt | None = None,
        kv_heads: PositiveInt | None = None,
        ff_mult: PositiveFloat = 4.0,
        qk_norm: bool = True,
        **options: Unpack[BlockOptions],
    ) -> None:
        super().__init__(**options)
        d_model = self.d_model
        if head_size is None and d_model % heads:
            raise OptionError("heads", heads, f"must divide d_model={d_model} (or set head_size)", type(self))
        head_size = head_size or d_model // heads
        key_size = key_size or head_size
        kv_heads = kv_heads or heads
        if heads % kv_heads:
            raise OptionError("kv_heads", kv_heads, f"must divide heads={heads}", type(self))
        self.heads, self.kv_heads, self.head_size, self.key_size = heads, kv_heads, head_size, key_size
        self.ff_mult, self.qk_norm = ff_mult, qk_norm
        self.norm1, self.norm2 = RMSNorm(d_model), RMSNorm(d_model)
        self.w_q = nn.Linear(d_model, heads * key_size, bias=False)
        self.w_kv = nn.Linear(d_model, kv_heads * (key_size + head_size), bias=False)
        self.w_o = nn.Linear(heads * head_size, d_model, bias=False)
        extra = {"kv_heads": kv_heads} if kv_heads != heads else {}
        self.attn = self.build_attention(key_size, head_size, heads, **extra)
        self.ff = GLUFeedForward(d_model, glu_hidden(d_model, ff_mult), self.dropout.p)

    def projection_flops(self, seq_len: int) -> int:
        """``W_q, W_kv, W_o`` and the SwiGLU ``W_in, W_out``: with ``F`` the GLU width,
        ``2T·d_model·(H·d_k + H_kv·(d_k + d_v) + H·d_v + 3F)``."""
        hidden = glu_hidden(self.d_model, self.ff_mult)
        heads, kv, d_k, d_v = self.heads, self.kv_heads, self.key_size, self.head_size
        return mm(seq_len, heads * d_k + kv * (d_k + d_v) + heads * d_v + 3 * hidden, self.d_model)

    def forward(self, x: Tensor, state: BlockState | None = None) -> tuple[Tensor, BlockState, Aux]:
        b, t, _ = x.shape
        h = self.norm1(x)
        q = self.w_q(h).view(b, t, self.heads, self.key_size).transpose(1, 2)
        k, v = (
            self.w_kv(h)
            .view(b, t, self.kv_heads, -1)
            .transpose(1, 2)
            .split([self.key_size, self.head_size], -1)
        )
        if self.qk_norm:
            q, k = rms_normalize(q), rms_normalize(k)
        scale = self.key_size**-0.25
        o, attn_state, last_key, aux = self.attend(q * scale, k * scale, v.contiguous(), state)
        attended, keep = self.residual(self.w_o(o.transpose(1, 2).reshape(b, t, -1)), state)
        x = x + attended
        x = x + self.layerdrop(self.dropout(self.ff(self.norm2(x))), keep)[0]
        return x, self.next_state(state, t, attn_state, keep, last_key), aux
