"""Transformer-VQ attention: quantised keys, an exact two-block window and a compressive cache.

Over 300 lines: the backend (options, FLOP count, state) and its forward's block bookkeeping (padding to
blocks, query items, the cache entries each block sees, where the carried state is cut) share one block
and state layout; the kernel, the cache means and the encoder form are already in ``kernel.py``,
``cache.py`` and ``bidirectional.py``.

Query ``i`` in block ``r`` (blocks of ``L`` positions) attends to
- blocks ``r-1`` and ``r`` exactly (causally), with the XL bias for distances ``<= window_len``;
- blocks ``0..r-2`` through the cache: per code ``s`` a count ``n_s`` and the mean value ``μ_s``,
  scored ``(q_i + u)·C_s + log n_s``.
Because quantised keys equal codebook rows, this is exactly softmax attention over the quantised
keys (bias clipped at the window), for every block length ``L >= window_len``. Cost per layer:
``O(T·(2L + S)·(d_k + d_v))``.

All blocks are computed at once. A carried state (the keys and values since the start of the
previous block plus the cache) is prepended as keys only, so a segment may start at any position:
continuation, partial blocks and token-by-token decoding share one code path.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Unpack

import torch
from torch import Tensor

from tvq_exp.attention.base import Aux, Shape, State, accumulation_dtype
from tvq_exp.attention.blocked import (
    BlockedAttention,
    BlockLayout,
    resolve_window,
    window_floats,
    window_start,
)
from tvq_exp.attention.flex_runtime import KERNELS, FlexSupport, wants_flex
from tvq_exp.attention.vq.bidirectional import encoder_attention
from tvq_exp.attention.vq.cache import running_code_means
from tvq_exp.attention.vq.fused.op import fused_window_cache_attention
from tvq_exp.attention.vq.fused.support import unsupported, wants_triton
from tvq_exp.attention.vq.kernel import (
    CodeCache,
    WindowBias,
    WindowInputs,
    window_cache_attention,
    window_index,
)
from tvq_exp.measure.flops import mm, padded, with_backward
from tvq_exp.nn.position import window_distances
from tvq_exp.options import NonNegativeInt, OneOf, OptionError, PositiveInt, checked
from tvq_exp.quantize.codebook import VectorQuantizer

VQ_KERNELS = (*KERNELS, "triton")  # the window + cache step: flex's choices and the fused Triton kernel


@dataclass(eq=False)
class VQState(State):
    """Transformer-VQ's state: the quantised keys ``k``, values ``v`` and ``codes`` of the positions since the start
    of the previous block ``(B, H_kv, W, ·)``; the cache summarising all earlier blocks, ``cache_n (B, H_kv, S)``
    counts (fp64) and ``cache_mu (B, H_kv, S, d_v)`` means (None with ``use_cache=False``)."""

    k: Tensor
    v: Tensor
    codes: Tensor
    cache_n: Tensor | None = None
    cache_mu: Tensor | None = None


class VQAttention(BlockedAttention):
    """Transformer-VQ attention backend (``causal=False``: the encoder form of :mod:`.bidirectional`).

    Args:
        shape: ``d_k, d_v, heads, causal, kv_heads`` (see :class:`~tvq_exp.attention.base.AttentionBackend`).
        codebook_size: ``S``, codes per key head.
        block_len: ``L``; the result does not depend on it as long as ``L >= window_len``.
        window_len: ``M``, the window of the Transformer-XL relative bias a block hands over (default
            ``block_len``).
        use_cache: False drops the compressive cache: a sliding window over the distances ``0..window_len``
            (the official ``agg_cache=0``, the paper's cache ablation).
        grad_through_cache: True: gradients flow through the cache means to the values and to the keys
            and values of the previous block in a window (inside a call; a carried state is always
            detached). False: the official ``grad_thru_cache=0``: a query's gradient reaches only the keys
            and values of its own block (the carried part of its window and the cache are constants).
        cache_key_grad: True: the cache scores' gradient reaches the keys of the cached blocks, as if each
            code ``C_s`` a query reads were the mean of the keys quantised to it so far (each of the
            ``n_s`` keys gets ``1/n_s`` of ``∂L/∂C_s``; the forward is unchanged). False (official): the
            cache scores give the keys no gradient: a key learns only from the queries of its own and the
            next block (docs/mqar_diagnosis.md). Needs ``grad_through_cache``, causal attention and the
            plain or Triton kernel while training (``kernel=auto`` takes one).
        codebook: keyword arguments of :class:`~tvq_exp.quantize.VectorQuantizer` (update, decay, remedies: docs/design.md §3).
        kernel: the window + cache step: ``plain`` (:mod:`.kernel`, chunked, its own backward), ``flex``
            (:mod:`.flex`: flex attention, compiled where it runs, else its eager form), ``triton`` (:mod:`.fused`:
            fused Triton kernels, forward and backward; CUDA, or CPU under ``TRITON_INTERPRET=1``; refused
            elsewhere) or ``auto`` (for calls of at least 128 queries: Triton on CUDA where it is installed, else
            compiled flex where it runs: CPU without gradients; else plain: decoding steps stay plain). The
            encoder form is always plain.

    Shapes: ``q (B, H, T, d_k)``, ``k (B, H_kv, T, d_k)``, ``v (B, H_kv, T, d_v)`` -> ``(B, H, T, d_v)``.
    State: :class:`VQState`: the positions ``max(0, (t//L - 1)·L) .. t-1`` and the cache of all earlier blocks
    (the encoder form carries none: a plain :class:`State`).
    """

    has_codebook = True
    kernels = VQ_KERNELS

    @checked
    def __init__(
        self,
        *,
        codebook_size: int = 512,
        block_len: PositiveInt = 512,
        window_len: NonNegativeInt | None = None,
        use_cache: bool = True,
        grad_through_cache: bool = True,
        cache_key_grad: bool = False,
        codebook: Mapping[str, Any] | None = None,
        kernel: Annotated[str, OneOf(*VQ_KERNELS)] = "plain",
        **shape: Unpack[Shape],
    ) -> None:
        super().__init__(**shape)
        window_len = resolve_window(window_len, block_len, type(self))
        self.block_len, self.window_len = block_len, window_len
        self.use_cache, self.grad_through_cache = use_cache, grad_through_cache
        if cache_key_grad and not (grad_through_cache and self.causal and kernel != "flex"):
            raise OptionError(
                "cache_key_grad", cache_key_grad,
                "needs grad_through_cache=True, causal attention and kernel plain, triton or auto", type(self),
            )  # fmt: skip
        refused = unsupported(None) if kernel == "triton" else None
        if refused:
            raise OptionError("kernel", kernel, f"{refused}; else one of {', '.join(KERNELS)}", type(self))
        self.cache_key_grad = cache_key_grad
        self.kernel = kernel
        self.last_kernel = "plain"  # the kernel the latest call ran (the benchmarks record it)
        self.quantizer = VectorQuantizer(self.kv_heads, codebook_size, self.d_k, **dict(codebook or {}))
        self.register_buffer("dist", window_distances(block_len), persistent=False)

    @property
    def codebook(self) -> Tensor:
        """Code vectors in use, ``(H_kv, S, d_k)``."""
        return self.quantizer.codebook

    @property
    def codebook_size(self) -> int:
        return self.quantizer.codebook_size

    def flops(self, seq_len: int, batch: int = 1, backward: bool = False) -> int | None:
        """Nearest-code search, then per query row one product with the ``W = 2L`` window keys plus ``S``
        codes and one with the matching values (plus the XL bias). A fresh sequence of one block has a
        one-block window (``W = L``); the codes enter only when ``T > 2L`` (a block sees blocks two back).

        Query rows: ``T`` padded to whole blocks (a single block: its ``T`` rows only). The backward
        kernel recomputes the scores (and the distance logits) and takes gradients of everything but
        the codes: ``2·attend + H·2L·d_k`` per row (``+ H·(M + 1)·d_k`` with the bias) besides the
        forward, less the cache means' gradient ``H·S·d_v`` without ``grad_through_cache``.
        ``O(T·(2L + S)·(d_k + d_v))``: linear in ``T``. The encoder form has no formula (``None``).

        The count is the plain kernel's and does not depend on :attr:`kernel` or :attr:`last_kernel`: every
        kernel (plain, flex, a fused one) does the same useful work, so throughput and MFU compare kernels on the
        same FLOPs (a kernel that skips masked tiles does fewer multiplications, and is credited for the speed).
        """
        if not self.causal:
            return None
        L, S, heads, d_k, d_v = self.block_len, self.codebook_size, self.heads, self.d_k, self.d_v
        lone = seq_len <= L  # one block: its rows only, a one-block window
        rows = seq_len if lone else padded(seq_len, L)
        window = L if lone else 2 * L
        cache = self.use_cache and seq_len > 2 * L  # some block sees blocks two back
        keys = window + (S if cache else 0)
        attend = heads * (mm(rows, keys, d_k) + mm(rows, d_v, keys))
        extra = heads * (
            mm(rows, window, d_k) + (mm(rows, self.window_len + 1, d_k) if self.bias is not None else 0)
        )
        if cache and not self.grad_through_cache:
            extra -= heads * mm(S, d_v, rows)
        total = batch * (
            self.kv_heads * mm(seq_len, S, d_k) + with_backward(attend, backward) + (extra if backward else 0)
        )
        return total + self.bias_flops(batch * rows, backward)

    def state_floats(self, seq_len: int) -> int:
        """Keys, values and codes since the start of the previous block, and the cache (``S`` counts and
        ``S`` means of ``d_v``; none with ``use_cache=False``), per key/value head."""
        cache = self.codebook_size * (1 + self.d_v) if self.use_cache else 0
        return self.kv_heads * (window_floats(seq_len, self.block_len, self.d_k + self.d_v + 1) + cache)

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, state: VQState | None = None
    ) -> tuple[Tensor, State, Aux]:
        self.check_inputs(q, k, v)
        if not self.causal and state is not None:
            raise ValueError("vq attention: a carried state only makes sense for causal attention")
        k_hat, codes, aux = self.quantizer(k)
        if not self.causal:
            out = encoder_attention(
                q, k_hat, codes, v, self.quantizer.codebook, self.bias, self.block_len,
                self.use_cache, self.grad_through_cache,
            )  # fmt: skip
            return out, State(q.shape[2]), aux
        state = state if state is not None else self.empty_state(k)
        t0, t_new = state.position, q.shape[2]
        n_buf = state.k.shape[2]
        keys = torch.cat([state.k.to(k_hat.dtype), k_hat], dim=2)
        values = torch.cat([state.v.to(v.dtype), v], dim=2)
        all_codes = torch.cat([state.codes, codes], dim=2)
        kb, vb, cb, valid = _to_blocks(keys, values, all_codes, self.block_len)
        vals = vb if self.grad_through_cache else vb.detach()
        prefix = key_means = (
            None  # without the cache there are no running code means (nor a cache in the state)
        )
        if self.use_cache:
            prefix = tuple(
                x.unflatten(0, cb.shape[:2])
                for x in running_code_means(
                    cb.flatten(0, 1),
                    vals.flatten(0, 1),
                    valid,
                    state.cache_n.flatten(0, 1),
                    state.cache_mu.flatten(0, 1),
                )
            )
            if self.cache_key_grad and torch.is_grad_enabled():
                n0 = state.cache_n.flatten(0, 1)
                mk0 = kb.new_zeros(*n0.shape, kb.shape[-1])  # a carried state's keys take no gradient
                key_means = running_code_means(cb.flatten(0, 1), kb.flatten(0, 1), valid, n0, mk0)[1]
                key_means = key_means.unflatten(0, cb.shape[:2])
        out = self._attend(q, kb, vb, prefix, n_buf, cached_before=t0 > n_buf, key_means=key_means)
        new_state = self._next_state(keys, values, all_codes, prefix, t0, t_new, t0 - n_buf)
        return out, new_state, aux

    def empty_state(self, k: Tensor) -> VQState:
        """State of a fresh sequence for keys like ``k (B, H_kv, ·, d_k)``."""
        b, h, _, dk = k.shape
        s = self.quantizer.codebook_size
        state = VQState(
            position=0,
            k=k.new_zeros(b, h, 0, dk),
            v=k.new_zeros(b, h, 0, self.d_v),
            codes=torch.zeros(b, h, 0, dtype=torch.long, device=k.device),
        )
        if self.use_cache:
            state.cache_n = torch.zeros(b, h, s, device=k.device, dtype=torch.float64)  # exact counts
            state.cache_mu = torch.zeros(b, h, s, self.d_v, device=k.device)
        return state

    def _attend(
        self,
        q: Tensor,
        kb: Tensor,
        vb: Tensor,
        prefix: tuple[Tensor, Tensor] | None,
        n_buf: int,
        cached_before: bool,
        key_means: Tensor | None = None,
    ) -> Tensor:
        """Outputs of the queries ``q (B, H, T, d_k)`` at positions ``n_buf..`` of the block-aligned
        keys ``kb (B, Hk, R, L, d_k)`` (values ``vb``), through :func:`window_cache_attention`.

        Only blocks holding queries are computed. Queries inside one block (decoding, short
        continuations) are taken as they are; queries spanning several blocks are padded to whole
        blocks (the padding rows are dropped). Work that can only be masked is skipped: a lone first
        block gets a one-block window, and the cache is left out while no query can see a cached
        block (``cached_before``: the state's cache holds blocks before ``kb``). ``key_means`` (the running
        means of the keys per code, like ``prefix``'s values; ``cache_key_grad``) turn the codes into
        per-item cache keys ``C + m - sg(m)``: the same scores, with a gradient to the cached keys.
        """
        b, h, t, _ = q.shape
        hk, L = kb.shape[1], self.block_len
        layout = BlockLayout.of(n_buf, t, L)
        first, last = layout.first, layout.last
        acc = accumulation_dtype(q.dtype)

        qc = q if self.bias is None else self.bias.content_query(q)
        blocks = slice(max(first - 1, 0), last + 1)
        kw, vw = kb[:, :, blocks].flatten(0, 1), vb[:, :, blocks].flatten(0, 1)
        lone = first == 0 and layout.items == 1  # a sequence's first block: a one-block window
        if first == 0 and not lone:  # no block before the first: a masked zero block
            kw, vw = (torch.nn.functional.pad(x, (0, 0, 0, 0, 1, 0)) for x in (kw, vw))
        dist = self.dist[layout.offset : layout.offset + layout.rows, L if lone else 0 :]
        span = None if self.use_cache else self.window_len  # without the cache: a sliding window over 0..M
        index = window_index(dist, None if self.bias is None else self.bias.max_distance, span)
        bias = cache = None
        if self.bias is not None:
            rel = self.bias.rel().to(q.dtype)
            rel = (
                rel.view(hk, -1, *rel.shape[1:])[None].expand(b, -1, -1, -1, -1).flatten(0, 1)
            )  # (B·Hk, G, M+1, d_k)
            bias = WindowBias(layout.to_grouped_items(self.bias.position_query(q), hk), rel)
        if self.use_cache and (cached_before or last >= 2):  # block r sees the cache of blocks <= r - 2
            cache_n, cache_mu = (_cache_entries(x, first, last).flatten(0, 1) for x in prefix)
            log_n = torch.where(cache_n > 0, cache_n.clamp_min(1e-30).log(), float("-inf")).to(acc)
            codebook = self.quantizer.codebook.detach().to(kw.dtype)[None].expand(b, -1, -1, -1).flatten(0, 1)
            cache = CodeCache(codebook, log_n, cache_mu)  # the means detached above unless grad_through_cache
            if key_means is not None:
                m = _cache_entries(key_means, first, last).flatten(0, 1)  # (B·Hk, I, S, d_k)
                cache = CodeCache(codebook[:, None] + (m - m.detach()).to(kw.dtype), log_n, cache_mu)
        fused = wants_triton(self.kernel, q)
        flex = not fused and key_means is None and wants_flex(self.kernel, self, q, kw, vw, FlexSupport(True))
        attend = fused_window_cache_attention if fused else window_cache_attention
        if flex:  # imported here: torch's flex module is slow to import (see flex_runtime.FLEX_AVAILABLE)
            from tvq_exp.attention.vq.flex import flex_window_cache_attention

            attend = flex_window_cache_attention
        self.last_kernel = "triton" if fused else "flex" if flex else "plain"
        inputs = WindowInputs(
            layout.to_grouped_items(qc, hk), kw, vw, index, bias, cache, prev_masked=first == 0 and not lone
        )
        out = attend(inputs, prev_grad=self.grad_through_cache)
        return layout.from_grouped_items(out, b, h)

    def _next_state(
        self,
        keys: Tensor,
        values: Tensor,
        codes: Tensor,
        prefix: tuple[Tensor, Tensor] | None,
        t0: int,
        t_new: int,
        p0: int,
    ) -> VQState:
        """State after position ``t0 + t_new``; ``p0`` is the (block-aligned) position of ``keys[:, :, 0]``."""
        L = self.block_len
        t_end = t0 + t_new
        start = window_start(t_end, L)
        last_cached = t_end // L - 2 - p0 // L  # index (in this call's blocks) of the newest cached block
        j = max(last_cached + 1, 0)
        state = VQState(
            position=t_end,
            k=keys[:, :, start - p0 :].detach(),
            v=values[:, :, start - p0 :].detach(),
            codes=codes[:, :, start - p0 :],
        )
        if prefix is not None:
            state.cache_n, state.cache_mu = prefix[0][:, :, j].detach(), prefix[1][:, :, j].detach()
        return state


def _to_blocks(
    keys: Tensor, values: Tensor, codes: Tensor, block_len: int
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Pad ``(B, Hk, n, ·)`` keys, values and codes to whole blocks: ``(B, Hk, R, L, ·)``, with the
    ``(R, L)`` mask of real (unpadded) positions."""
    b, hk, n = codes.shape
    r = -(-n // block_len)
    pad = r * block_len - n
    valid = torch.arange(r * block_len, device=codes.device) < n
    kb, vb = (
        torch.nn.functional.pad(x, (0, 0, 0, pad)).view(b, hk, r, block_len, -1) for x in (keys, values)
    )
    return (
        kb,
        vb,
        torch.nn.functional.pad(codes, (0, pad)).view(b, hk, r, block_len),
        valid.view(r, block_len),
    )


def _cache_entries(prefix: Tensor, first: int, last: int) -> Tensor:
    """Prefix entries ``r - 1`` (clamped at 0) for the blocks ``r = first..last``, along dim 2."""
    if first > 0:
        return prefix[:, :, first - 1 : last]
    return torch.cat([prefix[:, :, :1], prefix[:, :, :last]], dim=2)
