"""Dense (quadratic) attention: the exact baseline, with an optional windowed XL bias."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from tvq_exp.attention.base import AttentionBackend, Aux, State, accumulation_dtype, causal_mask, repeat_kv
from tvq_exp.nn.position import XLRelativeBias


class DenseAttention(AttentionBackend):
    """Softmax attention over all previous positions.

    Args:
        d_k, d_v, heads: per-head key and value sizes and the number of query heads.
        causal: decoder (True) or encoder (False) attention.
        window_bias: add the Transformer-XL relative bias for distances ``0..window_len``.
        window_len: the bias window ``M`` (required with ``window_bias``).
        memory_len: keep at most this many past keys in the carried state (None: all, exact).
        kv_heads: key/value heads (divides ``heads``; 1 = multi-query).

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
    ) -> None:
        super().__init__(d_k, d_v, heads, causal, kv_heads)
        if window_bias and (window_len is None or window_len < 1):
            raise ValueError(f"window_bias needs a positive window_len, got {window_len!r}")
        self.bias = XLRelativeBias(heads, d_k, window_len) if window_bias else None
        self.memory_len = memory_len

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
        if self.bias is None:
            if not self.causal:
                return F.scaled_dot_product_attention(q, k, v, scale=1.0)
            if past == 0:
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_mask(t_q, t_k, past, q.device), scale=1.0)
        dist = torch.arange(t_q, device=q.device)[:, None] + past - torch.arange(t_k, device=q.device)[None, :]
        logits = self.bias.content_query(q) @ k.transpose(-1, -2) + self.bias.bias(q, dist)
        if self.causal:
            logits = logits.masked_fill(dist < 0, float("-inf"))
        return torch.softmax(logits.to(accumulation_dtype(q.dtype)), dim=-1).to(v.dtype) @ v
