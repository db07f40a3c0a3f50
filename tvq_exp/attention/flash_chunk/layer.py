"""FLASH mixed chunk attention (Hua et al. 2022, "Transformer Quality in Linear Time").

Positions are split into groups of ``G`` (aligned on absolute positions ``0, G, 2G, ...``). Query
``i`` in group ``g`` combines
- a quadratic term over its own group: causal ``relu(s_ij)²`` (or softmax) with
  ``s_ij = (q_i [+ u])·k_j [+ XL bias]``;
- a linear term ``q_iᵀ Σ_j k_j v_jᵀ`` over the **exclusive** prefix of earlier groups (encoder: all
  other groups).
Normalisation is per position, by the number of keys actually summed or by a fixed scale, never by
the current total length: streaming and token-by-token decoding equal the parallel forward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Unpack

import torch
import torch.nn.functional as F
from torch import Tensor

from tvq_exp.attention.base import AttentionBackend, Aux, Shape, State, accumulation_dtype, own_copy
from tvq_exp.measure.flops import chunked_flops, padded, with_backward, xl_bias_flops
from tvq_exp.options import NonNegativeInt, OneOf, PositiveFloat, PositiveInt, checked

SCORES = ("relu2", "softmax")
NORMS = ("count", "fixed")


@dataclass(eq=False)
class FlashChunkState(State):
    """FLASH's state: the keys ``k`` and values ``v`` of the current partial group ``(B, H_kv, t mod G, d)``,
    ``kv = Σ k_j v_jᵀ (B, H_kv, d_k, d_v)`` over the ``n`` positions of all complete groups, ``n`` a 0-d int64
    tensor: a compiled step takes it as an input, where an int would be a constant it compiles once for each."""

    k: Tensor
    v: Tensor
    kv: Tensor
    n: Tensor

    def __post_init__(self) -> None:
        if not isinstance(self.n, Tensor):  # a checkpoint's state of before, when the count was an int
            self.n = torch.tensor(self.n, dtype=torch.long, device=self.kv.device)


class FlashChunkAttention(AttentionBackend):
    """FLASH mixed chunk attention.

    Args:
        shape: ``d_k, d_v, heads, causal, kv_heads`` (see :class:`~tvq_exp.attention.base.AttentionBackend`).
        group_size: ``G``, positions per group.
        score: ``relu2``: ``o_i = (Σ_quad relu(s_ij)² v_j + Σ_lin (q_i·k_j) v_j) / n_i``;
            ``softmax``: ``o_i = softmax_quad(s_i)·v + Σ_lin (q_i·k_j) v_j / n_i``.
        norm: ``count``: ``n_i`` is the number of keys summed by the normalised terms (at least 1);
            ``fixed``: ``n_i = norm_scale``.
        norm_scale: the fixed divisor (default ``group_size``).
        window_len: the window of the Transformer-XL relative bias a block hands over, inside the group
            (distances ``<= window_len``; encoder: ``|i - j| <= window_len``; default ``group_size``).

    Shapes: ``q (B, H, T, d_k)``, ``k (B, H_kv, T, d_k)``, ``v (B, H_kv, T, d_v)`` -> ``(B, H, T, d_v)``.
    State: :class:`FlashChunkState` (the encoder form carries none: a plain :class:`State`).
    """

    supports_position_bias = True

    @checked
    def __init__(
        self,
        *,
        group_size: PositiveInt = 256,
        score: Annotated[str, OneOf(*SCORES)] = "relu2",
        norm: Annotated[str, OneOf(*NORMS)] = "count",
        norm_scale: PositiveFloat | None = None,
        window_len: NonNegativeInt | None = None,
        **shape: Unpack[Shape],
    ) -> None:
        super().__init__(**shape)
        self.group_size, self.score, self.norm = group_size, score, norm
        self.norm_scale = float(group_size if norm_scale is None else norm_scale)
        self.window_len = group_size if window_len is None else window_len

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, state: FlashChunkState | None = None
    ) -> tuple[Tensor, State, Aux]:
        self.check_inputs(q, k, v)
        if not self.causal:
            if state is not None:
                raise ValueError(
                    "flash_chunk attention: a carried state only makes sense for causal attention"
                )
            out, _ = self._groups(q, k, v, k.new_zeros(1, 1, 1, 1), 0)
            return out, State(q.shape[2]), {}
        state = state if state is not None else self.empty_state(k)
        n_buf, t_new = state.k.shape[2], q.shape[2]
        keys = torch.cat([state.k.to(k.dtype), k], dim=2)
        values = torch.cat([state.v.to(v.dtype), v], dim=2)
        done = keys.shape[2] // self.group_size  # complete groups in this call
        if n_buf and keys.shape[2] <= self.group_size:  # inside the current group: its new rows only
            out = self._within_group(q, keys, values, state.kv, state.n)
            kv_done = keys.transpose(-1, -2) @ values if done else None
        else:
            queries = torch.cat([q.new_zeros(q.shape[0], q.shape[1], n_buf, q.shape[3]), q], dim=2)
            out, kv_groups = self._groups(queries, keys, values, state.kv, state.n)
            out, kv_done = out[:, :, n_buf:], kv_groups[:, :, :done].sum(2)
        kv = state.kv if kv_done is None else state.kv + kv_done.to(state.kv.dtype)
        new_state = FlashChunkState(
            position=state.position + t_new,
            k=own_copy(keys[:, :, done * self.group_size :].detach()),
            v=own_copy(values[:, :, done * self.group_size :].detach()),
            kv=kv.detach(),
            n=state.n + done * self.group_size,
        )
        return out, new_state, {}

    def flops(self, seq_len: int, batch: int = 1, backward: bool = False) -> int:
        """Groups of ``G`` (``T`` padded to whole groups, even when shorter), see
        :func:`~tvq_exp.measure.flops.chunked_flops` with ``d_f = d_k``, plus the XL bias inside the
        groups. The same count for both scores, both norms and the encoder."""
        whole = padded(seq_len, self.group_size)
        attend = chunked_flops(whole, self.group_size, self.d_k, self.d_v, self.heads, self.kv_heads)
        total = with_backward(batch * attend, backward)
        if self.bias is not None:
            total += xl_bias_flops(
                batch * whole,
                self.heads,
                self.d_k,
                self.bias.max_distance,
                backward,
                self.causal,
                d_sin=self.bias.proj.in_features,
            )
        return total

    def equivalent_position(self, t: int) -> int:
        """0: the position is bookkeeping only (a call reads the partial group's length from its keys, and the count
        of the positions before it from the state's tensor ``n``)."""
        return 0

    def state_floats(self, seq_len: int) -> int:
        """Keys and values of the current partial group and ``Σ k vᵀ (d_k, d_v)``, per key/value head."""
        partial = seq_len % self.group_size
        return self.kv_heads * (partial * (self.d_k + self.d_v) + self.d_k * self.d_v)

    def empty_state(self, k: Tensor) -> FlashChunkState:
        """State of a fresh sequence for keys like ``k (B, H_kv, ·, d_k)``."""
        b, h, _, dk = k.shape
        acc = accumulation_dtype(k.dtype)
        return FlashChunkState(
            position=0,
            k=k.new_zeros(b, h, 0, dk),
            v=k.new_zeros(b, h, 0, self.d_v),
            kv=torch.zeros(b, h, dk, self.d_v, device=k.device, dtype=acc),
            n=torch.zeros((), dtype=torch.long, device=k.device),
        )

    def _groups(
        self, q: Tensor, k: Tensor, v: Tensor, kv0: Tensor, n0: Tensor | int
    ) -> tuple[Tensor, Tensor]:
        """All groups at once for a sequence starting at a group boundary.

        ``kv0`` / ``n0``: linear state and length of the earlier (causal) context. Returns
        ``out (B, H, T, d_v)`` and the per-group sums ``k_jᵀ v_j`` ``(B, H_kv, R, d_k, d_v)``.
        """
        b, h, t, dk = q.shape
        hk, G = k.shape[1], self.group_size
        r = -(-t // G)
        pad = r * G - t
        acc = accumulation_dtype(q.dtype)
        valid = F.pad(torch.ones(t, dtype=torch.bool, device=q.device), (0, pad)).view(r, 1, G)
        q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
        qb = q.view(b, hk, h // hk, r, G, dk)
        kb, vb = k.view(b, hk, 1, r, G, dk), v.view(b, hk, 1, r, G, -1)

        dist = torch.arange(G, device=q.device)[:, None] - torch.arange(G, device=q.device)[None, :]
        quad_mask = valid & (dist >= 0) if self.causal else valid  # (R, G, G)
        logits = self._group_logits(q, qb, kb, dist).to(acc)

        kv = (kb.transpose(-1, -2) @ vb).to(acc)  # (B, Hk, 1, R, dk, dv)
        lin_kv, lin_n = self._context(kv, kv0.to(acc), n0, valid.view(r, G).sum(-1))
        lin = qb.to(acc) @ lin_kv  # (B, Hk, G, R, G, dv)
        out = self._combine(logits, quad_mask, vb.to(acc), lin, lin_n.view(r, 1, 1))
        return out.to(v.dtype).reshape(b, h, r * G, -1)[:, :, :t], kv.squeeze(2)

    def _within_group(self, q: Tensor, k: Tensor, v: Tensor, kv0: Tensor, n0: Tensor) -> Tensor:
        """Queries ``q (B, H, t, d_k)`` at the last ``t`` of the positions of one (partial) group,
        whose keys ``k (B, H_kv, n, d_k)`` and values start at the group boundary: ``(B, H, t, d_v)``."""
        b, h, t, dk = q.shape
        hk, n, acc = k.shape[1], k.shape[2], accumulation_dtype(q.dtype)
        qb = q.view(b, hk, h // hk, 1, t, dk)
        kb, vb = k.view(b, hk, 1, 1, n, dk), v.view(b, hk, 1, 1, n, -1)
        dist = torch.arange(n - t, n, device=q.device)[:, None] - torch.arange(n, device=q.device)[None, :]
        logits = self._group_logits(q, qb, kb, dist).to(acc)
        lin = qb.to(acc) @ kv0.to(acc).view(b, hk, 1, 1, dk, -1)
        out = self._combine(logits, dist >= 0, vb.to(acc), lin, n0)
        return out.to(v.dtype).reshape(b, h, t, -1)

    def _combine(self, logits: Tensor, quad_mask: Tensor, v: Tensor, lin: Tensor, lin_n: Tensor) -> Tensor:
        """Quadratic term over the visible keys of ``quad_mask`` plus the linear term ``lin`` over
        ``lin_n`` earlier positions, normalised (see the class docstring)."""
        if self.score == "relu2":
            w = F.relu(logits).square().masked_fill(~quad_mask, 0.0)
            return (w @ v + lin) / self._divisor(quad_mask.sum(-1, keepdim=True) + lin_n)
        a = torch.softmax(logits.masked_fill(~quad_mask, float("-inf")), dim=-1)
        return a @ v + lin / self._divisor(lin_n)

    def _group_logits(self, q: Tensor, qb: Tensor, kb: Tensor, dist: Tensor) -> Tensor:
        """Quadratic scores inside each group ``(B, Hk, Gh, R, G, G)``, with the XL bias if any."""
        if self.bias is None:
            return qb @ kb.transpose(-1, -2)
        b, hk, gh, r, rows, dk = qb.shape
        qc = self.bias.content_query(q).view_as(qb)
        qh = q.view(b, hk * gh, r, rows, dk)
        bias = self.bias.bias(qh, dist) if self.causal else self.bias.encoder_bias(qh, dist)
        return qc @ kb.transpose(-1, -2) + bias.view(b, hk, gh, r, rows, -1)

    def _context(self, kv: Tensor, kv0: Tensor, n0: Tensor | int, sizes: Tensor) -> tuple[Tensor, Tensor]:
        """Linear context of every group: ``(Σ k vᵀ (B, Hk, 1, R, dk, dv), its length (R,))``.

        Causal: ``kv0`` plus the groups before (an exclusive prefix). Encoder: every other group,
        as exclusive prefix plus exclusive suffix (nothing subtracted).
        """
        zero = torch.zeros_like(kv[:, :, :, :1])
        prefix = kv0.view(kv0.shape[0], kv0.shape[1], 1, 1, *kv0.shape[2:]) + torch.cat(
            [zero, kv[:, :, :, :-1].cumsum(3)], dim=3
        )
        before = n0 + torch.cat([sizes.new_zeros(1), sizes[:-1].cumsum(0)])
        if self.causal:
            return prefix, before
        suffix = torch.cat([kv[:, :, :, 1:].flip(3).cumsum(3).flip(3), zero], dim=3)
        return prefix + suffix, sizes.sum() - sizes

    def _divisor(self, n: Tensor) -> Tensor | float:
        return n.clamp_min(1) if self.norm == "count" else self.norm_scale
