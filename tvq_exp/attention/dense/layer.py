"""Dense (quadratic) attention: the exact baseline, with an optional windowed XL bias,
ReLU² scoring (FLASH-Quad) and talking-heads mixing of the logits."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Unpack

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from tvq_exp.attention.base import (
    AttentionBackend,
    Aux,
    Shape,
    State,
    accumulation_dtype,
    causal_mask,
    own_copy,
    repeat_kv,
)
from tvq_exp.attention.flex_runtime import KERNELS, FlexSupport, FlexUnsupported, wants_flex
from tvq_exp.measure.flops import mm, with_backward, xl_bias_flops
from tvq_exp.options import NonNegativeInt, OneOf, PositiveInt, checked

SCORES = ("softmax", "relu2")
LOGITS_BUDGET = 1 << 24  # logits per chunk of query rows (64 MiB in fp32) once explicit logits exceed it


@dataclass(eq=False)
class DenseState(State):
    """Dense attention's state: the kept past keys ``k (B, H_kv, t, d_k)`` and values ``v (B, H_kv, t, d_v)``."""

    k: Tensor
    v: Tensor


class DenseAttention(AttentionBackend):
    """Softmax (or ReLU²) attention over all previous positions.

    Args:
        shape: ``d_k, d_v, heads, causal, kv_heads`` (see :class:`~tvq_exp.attention.base.AttentionBackend`).
        window_len: the window ``M`` of the Transformer-XL relative bias a block hands over
            (:meth:`~tvq_exp.attention.base.AttentionBackend.use_position_bias`): distances ``0..M`` (encoder:
            ``|i - j| <= M``, see :meth:`~tvq_exp.nn.position.XLRelativeBias.encoder_bias`); required with the bias.
        memory_len: keep at most this many past keys in the carried state (None: all, exact).
        attention_window: attend only to keys at distances ``0..attention_window`` (encoder:
            ``|i - j| <=``; None: all): a sliding-window dense baseline, like Transformer-VQ without its cache.
        score: ``softmax`` or ``relu2`` (FLASH-Quad: ``relu(s)²`` divided per query by the number of
            keys it sees, never by the total length, so streaming equals the parallel forward).
        talking_heads: mix the logits across heads with a learned ``(H, H)`` matrix before the
            softmax (Shazeer et al. 2020); initialised to the identity.
        talking_heads_post: also mix the attention weights across heads after the softmax.
        kernel: ``plain`` (below), ``flex`` (:mod:`tvq_exp.attention.dense.flex`: the XL bias as a ``score_mod``, the
            causal/window mask as a block mask; compiled where it can run, eager otherwise; ReLU² and talking
            heads refuse it with the reason), ``auto`` (compiled flex where it runs, for calls of at least
            128 queries; else plain: decoding steps stay plain).

    Plain softmax runs in ``scaled_dot_product_attention`` (memory-efficient kernels). The XL bias,
    ReLU² and talking heads need explicit logits: beyond :data:`LOGITS_BUDGET` logits they are
    computed in chunks of query rows (see :func:`query_chunks`), each recomputed in the backward,
    so memory stays ``O(rows·T)`` instead of ``O(T²)`` and causal chunks skip the masked keys.

    Shapes: ``q, k (B, H, T, d_k)``, ``v (B, H, T, d_v)`` -> ``out (B, H, T, d_v)``.
    State: :class:`DenseState`, the past keys and values ``(B, H_kv, t, d)`` (at most ``memory_len``).
    """

    supports_position_bias = True
    supports_talking_heads = True
    kernels = KERNELS

    @checked
    def __init__(
        self,
        *,
        window_len: PositiveInt | None = None,
        memory_len: PositiveInt | None = None,
        attention_window: NonNegativeInt | None = None,
        score: Annotated[str, OneOf(*SCORES)] = "softmax",
        talking_heads: bool = False,
        talking_heads_post: bool = False,
        kernel: Annotated[str, OneOf(*KERNELS)] = "plain",
        **shape: Unpack[Shape],
    ) -> None:
        super().__init__(**shape)
        self.window_len = window_len
        self.memory_len, self.score, self.attention_window = memory_len, score, attention_window
        self.mix_pre = nn.Parameter(torch.eye(self.heads)) if talking_heads else None
        self.mix_post = nn.Parameter(torch.eye(self.heads)) if talking_heads_post else None
        self.kernel = kernel
        self.last_kernel = "plain"  # the kernel the latest call ran (the benchmarks record it)

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, state: DenseState | None = None
    ) -> tuple[Tensor, DenseState, Aux]:
        self.check_inputs(q, k, v)
        t_new = q.shape[2]
        t0 = 0 if state is None else state.position
        if state is not None and not self.causal:
            raise ValueError("a carried state only makes sense for causal attention")
        k_all = k if state is None else torch.cat([state.k.to(k.dtype), k], dim=2)
        v_all = v if state is None else torch.cat([state.v.to(v.dtype), v], dim=2)
        past = k_all.shape[2] - t_new
        out = self._dispatch(q, repeat_kv(k_all, self.heads), repeat_kv(v_all, self.heads), past)
        keep = min([k_all.shape[2], *(n for n in (self.memory_len, self.attention_window) if n is not None)])
        kept_k, kept_v = (own_copy(x[:, :, -keep:].detach()) for x in (k_all, v_all))
        return out, DenseState(t0 + t_new, kept_k, kept_v), {}

    def equivalent_position(self, t: int) -> int:
        """0: the position is bookkeeping only (a call reads the kept keys and values: their shapes say how many)."""
        return 0

    @property
    def needs_logits(self) -> bool:
        """Whether the logits are computed explicitly (XL bias, ReLU², talking heads) instead of by SDPA."""
        return (
            self.bias is not None
            or self.score != "softmax"
            or self.mix_pre is not None
            or self.mix_post is not None
        )

    def flops(self, seq_len: int, batch: int = 1, backward: bool = False) -> int:
        """``q·kᵀ`` and ``p·v`` over the full ``T×T`` square (plus the XL bias over the distances
        ``0..M``; encoder ``-M..M``): ``H·(2T²d_k + 2T²d_v)`` per sequence, whatever the score and
        ``kv_heads`` (keys and values are repeated to every query head). With explicit logits beyond the
        chunking budget (:func:`query_chunks`), each chunk of query rows over its visible keys only, and
        the chunk's scores once more in the backward (recomputation). Talking heads mix the
        ``(H, T, T)`` logits (and the weights) with an ``(H, H)`` matrix: ``2H²T²`` each."""
        heads, causal = self.heads, self.causal
        chunks = (
            query_chunks(batch * heads, seq_len, seq_len, 0, causal)
            if self.needs_logits
            else [(0, seq_len, seq_len)]
        )
        mixes = int(self.mix_pre is not None) + int(self.mix_post is not None)
        scores = sum(
            heads * mm(i1 - i0, end, self.d_k) + mixes * mm(heads, (i1 - i0) * end, heads)
            for i0, i1, end in chunks
        )
        fwd = scores + sum(heads * mm(i1 - i0, self.d_v, end) for i0, i1, end in chunks)
        recompute = len(chunks) > 1 and backward  # checkpointed chunks recompute their scores
        total = batch * (with_backward(fwd, backward) + (scores if recompute else 0))
        if self.bias is not None:
            window = self.bias.max_distance
            total += xl_bias_flops(
                batch * seq_len, heads, self.d_k, window, backward, causal, d_sin=self.bias.proj.in_features
            )
            if recompute:  # the distance logits again (the relative embeddings are an input of the chunks)
                distances = window + 1 if causal else 2 * window + 1
                total += heads * mm(batch * seq_len, distances, self.d_k)
        return total

    def state_floats(self, seq_len: int) -> int:
        """The keys and values kept: ``min(T, memory_len)`` positions of ``H_kv·(d_k + d_v)``."""
        kept = min([seq_len, *(n for n in (self.memory_len, self.attention_window) if n is not None)])
        return kept * self.kv_heads * (self.d_k + self.d_v)

    def flex_support(
        self, device: torch.device | str, requires_grad: bool = False, compiled: bool = True
    ) -> FlexSupport:
        """Whether this module's options run through flex attention on ``device`` (and why not)."""
        # imported here: torch's flex module is slow to import, and a refused config must not pay for it
        from tvq_exp.attention.dense.flex import dense_flex_support

        talking = self.mix_pre is not None or self.mix_post is not None
        return dense_flex_support(
            device, score=self.score, talking_heads=talking, requires_grad=requires_grad, compiled=compiled
        )

    def attend_flex(
        self, q: Tensor, k: Tensor, v: Tensor, past: int = 0, compiled: bool | None = None
    ) -> Tensor:
        """What the plain path computes (XL bias included), through flex attention: ``q (B, H, Tq, d_k)``,
        ``k (B, H, Tk, d_k)``, ``v (B, H, Tk, d_v)`` with ``Tk = past + Tq`` (keys and values already repeated to
        every query head) -> ``(B, H, Tq, d_v)``. The content query is ``q + u``; the distance logits
        ``(q + v)·r_d`` are made here, once per call, and gathered by the ``score_mod``; ``attention_window``
        becomes the mask's window. Raises :class:`~tvq_exp.attention.flex_runtime.FlexUnsupported` for ReLU²
        scores and talking heads."""
        support = self.flex_support(q.device, compiled=False)
        if not support.ok:
            raise FlexUnsupported(support.reason)
        window, table = self.attention_window, None
        if self.bias is not None:
            rel = self.relative_embeddings().to(
                q.dtype
            )  # (H, M+1 | 2M+1, d_k), once per call (as the plain path)
            table = torch.matmul(self.bias.position_query(q), rel.transpose(-1, -2).unsqueeze(0))
            q = self.bias.content_query(q)
        from tvq_exp.attention.dense.flex import flex_dense_attention  # lazy: see flex_support

        return flex_dense_attention(
            q, k, v, causal=self.causal, past=past, window=window, distance_logits=table, compiled=compiled
        )

    def _dispatch(self, q: Tensor, k: Tensor, v: Tensor, past: int) -> Tensor:
        """``kernel``: ``plain`` (:meth:`attend_plain`), ``flex`` (:meth:`attend_flex`: the compiled kernel where it
        runs, else its eager form), ``auto`` (see :func:`~tvq_exp.attention.flex_runtime.wants_flex`)."""
        flex = wants_flex(self.kernel, self, q, k, v, self.flex_support(q.device, compiled=False))
        self.last_kernel = "flex" if flex else "plain"
        return self.attend_flex(q, k, v, past) if flex else self.attend_plain(q, k, v, past)

    def attend_plain(self, q: Tensor, k: Tensor, v: Tensor, past: int) -> Tensor:
        """The plain path (``kernel=plain``): ``q (B, H, Tq, d_k)`` at positions ``past..`` against ``k, v`` (already
        repeated to every query head) -> ``(B, H, Tq, d_v)``; SDPA where no explicit logits are needed."""
        t_q, t_k = q.shape[2], k.shape[2]
        if not self.needs_logits:
            if self.attention_window is not None:
                mask = self._visible(_distances(t_q, t_k, past, q.device))
                return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0)
            if not self.causal:
                return F.scaled_dot_product_attention(q, k, v, scale=1.0)
            if past == 0:
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0)
            mask = causal_mask(t_q, t_k, past, q.device)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0)
        rel = None if self.bias is None else self.relative_embeddings()
        chunks = query_chunks(q.shape[0] * q.shape[1], t_q, t_k, past, self.causal)
        if len(chunks) == 1:
            return self._explicit(q, k, v, rel, past)
        outs = []
        for i0, i1, end in chunks:  # each chunk recomputed in the backward: O(rows·T) memory, not O(T²)
            args = (q[:, :, i0:i1], k[:, :, :end], v[:, :, :end], rel, past + i0)
            if torch.is_grad_enabled():
                outs.append(checkpoint(self._explicit, *args, use_reentrant=False, preserve_rng_state=False))
            else:
                outs.append(self._explicit(*args))
        return torch.cat(outs, dim=2)

    def _visible(self, dist: Tensor) -> Tensor:
        """Which keys each query sees, from the distances (query minus key) ``(Tq, Tk)``: causal and within
        the attention window."""
        visible = dist >= 0 if self.causal else torch.ones_like(dist, dtype=torch.bool)
        if self.attention_window is not None:
            visible = visible & (dist.abs() <= self.attention_window)
        return visible

    def relative_embeddings(self) -> Tensor:
        """The bias's projected relative embeddings (one- or two-sided), computed once per call."""
        return self.bias.rel() if self.causal else self.bias.signed_rel()

    def _explicit(self, q: Tensor, k: Tensor, v: Tensor, rel: Tensor | None, offset: int) -> Tensor:
        """Explicit logits (XL bias with relative embeddings ``rel``, ReLU² scores, talking heads) of
        queries ``q (B, H, Tq, d)`` at positions ``offset..`` against keys ``k (B, H, Tk, d)`` at
        ``0..Tk-1``: ``(B, H, Tq, d_v)``. The distances are made here, so a checkpointed chunk keeps
        nothing of size ``Tq·Tk`` for its backward."""
        acc = accumulation_dtype(q.dtype)
        dist = _distances(q.shape[2], k.shape[2], offset, q.device)
        if self.bias is None:
            logits = q @ k.transpose(-1, -2)
        else:
            bias = self.bias.bias(q, dist, rel) if self.causal else self.bias.encoder_bias(q, dist, rel)
            logits = self.bias.content_query(q) @ k.transpose(-1, -2) + bias
        logits = _mix_heads(self.mix_pre, logits.to(acc))
        visible = self._visible(dist)
        if self.score == "softmax":
            weights = torch.softmax(logits.masked_fill(~visible, float("-inf")), dim=-1)
        else:
            weights = F.relu(logits).square().masked_fill(~visible, 0.0) / visible.sum(-1, keepdim=True)
        return _mix_heads(self.mix_post, weights).to(v.dtype) @ v


def query_chunks(batch_heads: int, t_q: int, t_k: int, past: int, causal: bool) -> list[tuple[int, int, int]]:
    """``(start, stop, keys)`` of the chunks of query rows of explicit-logit attention: at most
    :data:`LOGITS_BUDGET` logits each (over ``batch_heads`` heads); a causal chunk sees only the
    keys up to its last query (``past + stop``), so the masked upper triangle is skipped."""
    rows = max(1, LOGITS_BUDGET // max(1, batch_heads * t_k))
    if rows >= t_q:
        return [(0, t_q, t_k)]
    return [
        (i0, min(t_q, i0 + rows), min(t_k, past + min(t_q, i0 + rows)) if causal else t_k)
        for i0 in range(0, t_q, rows)
    ]


def _distances(t_q: int, t_k: int, past: int, device: torch.device) -> Tensor:
    """Query minus key position ``(t_q, t_k)``; queries start ``past`` positions after the keys."""
    return torch.arange(t_q, device=device)[:, None] + past - torch.arange(t_k, device=device)[None, :]


def _mix_heads(mix: Tensor | None, x: Tensor) -> Tensor:
    """Talking heads: ``x'_h = Σ_g mix[h, g]·x_g`` for ``x (B, H, Tq, Tk)`` (identity when ``mix`` is None)."""
    return x if mix is None else torch.einsum("hg,bgij->bhij", mix.to(x.dtype), x)
