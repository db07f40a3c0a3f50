"""Dense (quadratic) attention: the exact baseline, with an optional windowed XL bias,
ReLU² scoring (FLASH-Quad) and talking-heads mixing of the logits."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tvq_exp.attention.base import AttentionBackend, Aux, State, accumulation_dtype, causal_mask, repeat_kv
from tvq_exp.attention.vq_bidirectional import encoder_bias
from tvq_exp.nn.position import XLRelativeBias

SCORES = ("softmax", "relu2")


class DenseAttention(AttentionBackend):
    """Softmax (or ReLU²) attention over all previous positions.

    Args:
        d_k, d_v, heads: per-head key and value sizes and the number of query heads.
        causal: decoder (True) or encoder (False) attention.
        window_bias: add the Transformer-XL relative bias for distances ``0..window_len``
            (encoder: ``|i - j| <= window_len``, see :func:`~.vq_bidirectional.encoder_bias`).
        window_len: the bias window ``M`` (required with ``window_bias``).
        memory_len: keep at most this many past keys in the carried state (None: all, exact).
        kv_heads: key/value heads (divides ``heads``; 1 = multi-query).
        score: ``softmax`` or ``relu2`` (FLASH-Quad: ``relu(s)²`` divided per query by the number of
            keys it sees, never by the total length, so streaming equals the parallel forward).
        talking_heads: mix the logits across heads with a learned ``(H, H)`` matrix before the
            softmax (Shazeer et al. 2020); initialised to the identity.
        talking_heads_post: also mix the attention weights across heads after the softmax.

    Shapes: ``q, k (B, H, T, d_k)``, ``v (B, H, T, d_v)`` -> ``out (B, H, T, d_v)``.
    State: ``{"k", "v"}`` past keys and values ``(B, H_kv, t, d)`` and the position ``"t"``.
    """

    def __init__(
        self,
        d_k: int,
        d_v: int,
        heads: int = 1,
        causal: bool = True,
        window_bias: bool = False,
        window_len: int | None = None,
        memory_len: int | None = None,
        kv_heads: int | None = None,
        score: str = "softmax",
        talking_heads: bool = False,
        talking_heads_post: bool = False,
    ) -> None:
        super().__init__(d_k, d_v, heads, causal, kv_heads)
        if window_bias and (window_len is None or window_len < 1):
            raise ValueError(f"window_bias needs a positive window_len, got {window_len!r}")
        if score not in SCORES:
            raise ValueError(f"dense attention: score must be one of {SCORES}, got {score!r}")
        self.bias = XLRelativeBias(heads, d_k, window_len) if window_bias else None
        self.memory_len, self.score = memory_len, score
        self.mix_pre = nn.Parameter(torch.eye(heads)) if talking_heads else None
        self.mix_post = nn.Parameter(torch.eye(heads)) if talking_heads_post else None

    def forward(self, q: Tensor, k: Tensor, v: Tensor, state: State | None = None) -> tuple[Tensor, State, Aux]:
        self.check_inputs(q, k, v)
        t_new = q.shape[2]
        t0 = 0 if state is None else int(state["t"])
        if state is not None and not self.causal:
            raise ValueError("a carried state only makes sense for causal attention")
        k_all = k if state is None else torch.cat([state["k"].to(k.dtype), k], dim=2)
        v_all = v if state is None else torch.cat([state["v"].to(v.dtype), v], dim=2)
        past = k_all.shape[2] - t_new
        out = self._attend(q, repeat_kv(k_all, self.heads), repeat_kv(v_all, self.heads), past)
        keep = k_all.shape[2] if self.memory_len is None else min(self.memory_len, k_all.shape[2])
        new_state: State = {"k": k_all[:, :, -keep:].detach(), "v": v_all[:, :, -keep:].detach(), "t": t0 + t_new}
        return out, new_state, {}

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, past: int) -> Tensor:
        t_q, t_k = q.shape[2], k.shape[2]
        if self.score != "softmax" or self.mix_pre is not None or self.mix_post is not None:
            return self._attend_explicit(q, k, v, past)
        if self.bias is None:
            if not self.causal:
                return F.scaled_dot_product_attention(q, k, v, scale=1.0)
            if past == 0:
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_mask(t_q, t_k, past, q.device), scale=1.0)
        dist = _distances(t_q, t_k, past, q.device)
        logits = self.bias.content_query(q) @ k.transpose(-1, -2) + self._bias(q, dist)
        if self.causal:
            logits = logits.masked_fill(dist < 0, float("-inf"))
        return torch.softmax(logits.to(accumulation_dtype(q.dtype)), dim=-1).to(v.dtype) @ v

    def _bias(self, q: Tensor, dist: Tensor) -> Tensor:
        return self.bias.bias(q, dist) if self.causal else encoder_bias(self.bias, q, dist)

    def _attend_explicit(self, q: Tensor, k: Tensor, v: Tensor, past: int) -> Tensor:
        """Full logits: ReLU² scores and / or talking heads. ``q (B, H, Tq, d)`` -> ``(B, H, Tq, d_v)``."""
        acc = accumulation_dtype(q.dtype)
        dist = _distances(q.shape[2], k.shape[2], past, q.device)
        if self.bias is None:
            logits = q @ k.transpose(-1, -2)
        else:
            logits = self.bias.content_query(q) @ k.transpose(-1, -2) + self._bias(q, dist)
        logits = _mix_heads(self.mix_pre, logits.to(acc))
        visible = dist >= 0 if self.causal else torch.ones_like(dist, dtype=torch.bool)
        if self.score == "softmax":
            weights = torch.softmax(logits.masked_fill(~visible, float("-inf")), dim=-1)
        else:
            weights = F.relu(logits).square().masked_fill(~visible, 0.0) / visible.sum(-1, keepdim=True)
        return _mix_heads(self.mix_post, weights).to(v.dtype) @ v


def _distances(t_q: int, t_k: int, past: int, device: torch.device) -> Tensor:
    """Query minus key position ``(t_q, t_k)``; queries start ``past`` positions after the keys."""
    return torch.arange(t_q, device=device)[:, None] + past - torch.arange(t_k, device=device)[None, :]


def _mix_heads(mix: Tensor | None, x: Tensor) -> Tensor:
    """Talking heads: ``x'_h = Σ_g mix[h, g]·x_g`` for ``x (B, H, Tq, Tk)`` (identity when ``mix`` is None)."""
    return x if mix is None else torch.einsum("hg,bgij->bhij", mix.to(x.dtype), x)
