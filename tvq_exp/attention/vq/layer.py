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

from tvq_exp.attention.base import Aux, Shape, State, accumulation_dtype, own_copy
from tvq_exp.attention.blocked import (
    BlockedAttention,
    BlockLayout,
    resolve_window,
    window_floats,
    window_start,
)
from tvq_exp.attention.flex_runtime import KERNELS, FlexSupport, wants_flex
from tvq_exp.attention.vq.bidirectional import encoder_attention
from tvq_exp.attention.vq.cache import CacheMeans, cache_means, item_entries, running_code_means
from tvq_exp.attention.vq.fused.op import fused_window_cache_attention
from tvq_exp.attention.vq.fused.prefix import fused_cache_means, why_not
from tvq_exp.attention.vq.fused.support import unsupported, wants_triton
from tvq_exp.attention.vq.kernel import (
    CodeCache,
    WindowBias,
    WindowIndex,
    WindowInputs,
    window_cache_attention,
)
from tvq_exp.measure.flops import mm, padded, with_backward
from tvq_exp.options import NonNegativeInt, OneOf, OptionError, PositiveInt, checked
from tvq_exp.quantize.codebook import VectorQuantizer

VQ_KERNELS = (*KERNELS, "triton")  # the window + cache step: flex's choices and the fused Triton kernel


@dataclass(eq=False)
class VQState(State):
    """Transformer-VQ's state: the quantised keys ``k``, values ``v`` and ``codes`` of the positions since the start
    of the previous block ``(B, H_kv, W, ·)``; the cache summarising all earlier blocks, ``cache_n (B, H_kv, S)``
    counts (fp64) and ``cache_mu (B, H_kv, S, d_v)`` means (None with ``use_cache=False``); with
    ``cache_keys="mean"`` also the positions' keys before quantisation ``raw_k (B, H_kv, W, d_k)`` and the cache's
    running key means ``cache_k (B, H_kv, S, d_k)``."""

    k: Tensor
    v: Tensor
    codes: Tensor
    cache_n: Tensor | None = None
    cache_mu: Tensor | None = None
    raw_k: Tensor | None = None
    cache_k: Tensor | None = None


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
        cache_code_grad: True: the cache scores ``q·C_s + log n_s`` pass their gradient to the codes ``C_s``
            (the official code detaches the codebook there): the codes learn from what the cache's reads need.
            Needs a trainable codebook (``codebook.update=gradient`` or ``affine``; EMA codes are running means,
            not parameters), ``grad_through_cache``, causal attention and the plain or Triton kernel while
            training. The forward is unchanged.
        cache_keys: what the cache reads a code by: ``code`` (the official ``C_s``) or ``mean``: the running mean
            ``m_s`` of this sequence's keys (before quantisation, in the search space) quantised to ``s`` in the
            cached blocks, scored ``(q_i + u)·m_s + log n_s`` (the dictionary of the sequence's own keys that OVQ
            reads, applied to VQ's cache): the forward feels the cached keys, and their gradient is the cache
            scores' (each of the ``n_s`` keys gets ``1/n_s`` of ``∂L/∂m_s``). The window still reads the
            quantised keys ``C_z``; the state carries the ``S`` key means (``S·d_k`` floats more per head) and
            the window's raw keys. Needs causal attention and the plain or Triton kernel (not with
            ``cache_key_grad`` or ``cache_code_grad``: the codes are not read by the cache). The quantiser's
            soft-to-hard schedule ``codebook.hard_warmup`` (the window reads keys between the key and its code
            while it lasts) needs it, or ``use_cache=False``: the official cache reads the codes themselves.
        codebook: keyword arguments of :class:`~tvq_exp.quantize.VectorQuantizer` (update, decay, remedies: docs/design.md §3).
        kernel: the window + cache step: ``plain`` (:mod:`.kernel`, chunked, its own backward), ``flex``
            (:mod:`.flex`: flex attention, compiled where it runs, else its eager form), ``triton`` (:mod:`.fused`:
            fused Triton kernels, forward and backward; CUDA, or CPU under ``TRITON_INTERPRET=1``; refused
            elsewhere) or ``auto`` (for calls of at least 128 queries: Triton on CUDA where it is installed and the
            values fit two of its forward's chunks, ``d_v <= 256``: wider values, the GAU's 1536, take the plain
            kernel's GEMMs; else compiled flex where it runs: CPU without gradients; else plain: decoding steps stay
            plain). The encoder form is always plain.

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
        cache_code_grad: bool = False,
        cache_keys: Annotated[str, OneOf("code", "mean")] = "code",
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
        self._check_cache_reads(cache_code_grad, cache_keys)
        self.cache_code_grad, self.cache_keys = cache_code_grad, cache_keys

    def _check_cache_reads(self, cache_code_grad: bool, cache_keys: str) -> None:
        """Refuse ``cache_code_grad`` / ``cache_keys="mean"`` / ``codebook.hard_warmup`` where they cannot hold (see
        the class docstring)."""
        layout = self.causal and self.kernel != "flex"
        if cache_code_grad:
            if not self.quantizer.rule.trainable:
                raise OptionError(
                    "cache_code_grad", cache_code_grad,
                    "needs a trainable codebook (codebook.update=gradient or affine; EMA codes take no gradient)",
                    type(self),
                )  # fmt: skip
            if not (self.grad_through_cache and layout) or cache_keys == "mean":
                raise OptionError(
                    "cache_code_grad", cache_code_grad,
                    "needs grad_through_cache=True, causal attention, kernel plain, triton or auto and "
                    "cache_keys=code", type(self),
                )  # fmt: skip
        if self.quantizer.hard_warmup and self.use_cache and cache_keys != "mean":
            raise OptionError(
                "codebook.hard_warmup", self.quantizer.hard_warmup,
                "> 0 needs cache_keys=mean or use_cache=False: the official cache reads the codes C_s, while the "
                "window would read keys between the key and its code (0: off)", type(self),
            )  # fmt: skip
        if cache_keys == "mean" and not (layout and not self.cache_key_grad):
            raise OptionError(
                "cache_keys", cache_keys,
                "'mean' needs causal attention, kernel plain, triton or auto and cache_key_grad=False "
                "(the mean keys already take the cache scores' gradient)", type(self),
            )  # fmt: skip

    @property
    def mean_keys(self) -> bool:
        """Whether the cache reads each code by the running mean of the sequence's keys (``cache_keys="mean"``)."""
        return self.cache_keys == "mean" and self.use_cache

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
        ``S`` means of ``d_v``; none with ``use_cache=False``), per key/value head; with ``cache_keys="mean"``
        also the ``S`` key means and the window's keys before quantisation."""
        cache = self.codebook_size * (1 + self.d_v) if self.use_cache else 0
        per_position = self.d_k + self.d_v + 1
        if self.mean_keys:  # the key means, and the window's keys before quantisation
            cache, per_position = cache + self.codebook_size * self.d_k, per_position + self.d_k
        return self.kv_heads * (window_floats(seq_len, self.block_len, per_position) + cache)

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
        keys, values, all_codes = _join(state.k, k_hat), _join(state.v, v), _join(state.codes, codes)
        kb, vb, cb, valid = _to_blocks(keys, values, all_codes, self.block_len)
        layout = BlockLayout.of(n_buf, t_new, self.block_len)  # the blocks that hold queries
        prefix = key_means = (
            None  # without the cache there are no running code means (nor a cache in the state)
        )
        if self.use_cache:
            fused_means = self.means_kernel(vb) == "triton"
            if not fused_means:
                # the values' one copy (none with one key head): (B·Hk, R, L, d_v) for the plain means, and a view of
                # it the window's (the fused means and window read them through their strides)
                vb = vb.contiguous()
            vals = vb if self.grad_through_cache else vb.detach()
            means = fused_cache_means if fused_means else cache_means
            vals = vals if fused_means else vals.flatten(0, 1)
            n0, mu0 = state.cache_n.flatten(0, 1), state.cache_mu.flatten(0, 1)
            # the items' entries where they read the cache (block r sees the cache of blocks <= r - 2), and the state's
            items = layout.items if t0 > n_buf or layout.last >= 2 else 0
            newest = self._newest_entry(t0 + t_new, t0 - n_buf)
            prefix = means(cb.flatten(0, 1), vals, valid, n0, mu0, layout.first, items, newest)
            if self.mean_keys:  # the running means of the keys before quantisation
                raw = torch.cat([state.raw_k.to(k.dtype), self.quantizer.search_keys(k)], dim=2)
                raw_blocks = _pad_blocks(raw, self.block_len)
                raw_blocks = raw_blocks if self.grad_through_cache else raw_blocks.detach()
                key_means = _code_means(cb, raw_blocks, valid, state.cache_n, state.cache_k)
            elif self.cache_key_grad and torch.is_grad_enabled():
                mk0 = kb.new_zeros(
                    *state.cache_n.shape, kb.shape[-1]
                )  # a carried state's keys take no gradient
                key_means = _code_means(cb, kb, valid, state.cache_n, mk0)
        out = self._attend(q, kb, vb, prefix, layout, key_means=key_means)
        new_state = self._next_state(keys, values, all_codes, prefix, t0, t_new, t0 - n_buf)
        if self.mean_keys:  # the same cut as the values' and the cache's
            new_state.raw_k, new_state.cache_k = self._next_keys(raw, key_means, t0 + t_new, t0 - n_buf)
        return out, new_state, aux

    def equivalent_position(self, t: int) -> int:
        """``t`` before two blocks, else ``2L + t mod L``: past its second block a state's window starts a block
        before its last block start, the cache holds whole blocks, and every branch reads the position only through
        ``t mod L`` and differences of block indices (the first call at ``t >= 2L`` reads the cache's prefix entries
        where ``t < 2L`` does not)."""
        L = self.block_len
        return t if t < 2 * L else 2 * L + t % L

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
        if self.mean_keys:
            state.raw_k, state.cache_k = k.new_zeros(b, h, 0, dk), torch.zeros(b, h, s, dk, device=k.device)
        return state

    def _attend(
        self,
        q: Tensor,
        kb: Tensor,
        vb: Tensor,
        prefix: CacheMeans | None,
        layout: BlockLayout,
        key_means: Tensor | None = None,
    ) -> Tensor:
        """Outputs of the queries ``q (B, H, T, d_k)``, in the blocks ``layout`` places them, of the block-aligned
        keys ``kb (B, Hk, R, L, d_k)`` (values ``vb``), through :func:`window_cache_attention`.

        Only blocks holding queries are computed. Queries inside one block (decoding, short
        continuations) are taken as they are; queries spanning several blocks are padded to whole
        blocks (the padding rows are dropped). Work that can only be masked is skipped: a lone first
        block gets a one-block window, and the cache is left out while no query can see a cached
        block (``prefix`` has no items then). ``key_means`` (the running means of the keys per code, like the
        prefix's values; ``cache_key_grad``, ``cache_keys="mean"``) make per-item cache keys (:meth:`_cache_keys`).
        """
        b, h = q.shape[:2]
        hk, L = kb.shape[1], self.block_len
        first, last = layout.first, layout.last
        acc = accumulation_dtype(q.dtype)

        qc = q if self.bias is None else self.bias.content_query(q)
        lone = first == 0 and layout.items == 1  # a sequence's first block: a one-block window
        span = None if self.use_cache else self.window_len  # without the cache: a sliding window over 0..M
        max_distance = None if self.bias is None else self.bias.max_distance
        index = WindowIndex.of_block(L, layout.offset, layout.rows, lone, max_distance, span)
        bias = cache = None
        if self.bias is not None:
            rel = self.bias.rel().to(q.dtype)
            rel = (
                rel.view(hk, -1, *rel.shape[1:])[None].expand(b, -1, -1, -1, -1).flatten(0, 1)
            )  # (B·Hk, G, M+1, d_k)
            bias = WindowBias(layout.to_grouped_items(self.bias.position_query(q), hk), rel)
        if prefix is not None and prefix.items.shape[1]:  # block r sees the cache of blocks <= r - 2
            cache_n = item_entries(prefix.counts, first, last)
            # whole counts: an unused code's log(0) = -inf (two launches, not five)
            log_n = cache_n.log().to(acc)
            cache = CodeCache(self._cache_keys(b, key_means, first, last, kb.dtype), log_n, prefix.items)
        per_item = cache is not None and cache.codebook.dim() == 4  # flex reads one codebook for every item
        self.last_kernel = self.window_kernel(q, kb, vb, per_item)
        blocks = slice(max(first - 1, 0), last + 1)
        kw, vw = kb[:, :, blocks], vb[:, :, blocks]
        if self.last_kernel == "triton":
            # the fused kernels read every row through its strides, (B, Hk) unmerged: no copy of the queries, keys or
            # values in any heads' layout; and no block before the first (they read none)
            queries = layout.grouped_items(qc, hk)
        else:
            # the others take a masked zero block, joined in front (the one copy; the join's gradient is a view of
            # the window's, where a pad's is another copy)
            if first == 0 and not lone:
                kw, vw = (torch.cat([torch.zeros_like(x[:, :, :1]), x], dim=2) for x in (kw, vw))
            queries, kw, vw = layout.to_grouped_items(qc, hk), kw.flatten(0, 1), vw.flatten(0, 1)
        attend = fused_window_cache_attention if self.last_kernel == "triton" else window_cache_attention
        if self.last_kernel == "flex":  # imported here: torch's flex module is slow to import
            from tvq_exp.attention.vq.flex import flex_window_cache_attention

            attend = flex_window_cache_attention
        inputs = WindowInputs(queries, kw, vw, index, bias, cache, prev_masked=first == 0 and not lone)
        out = attend(inputs, prev_grad=self.grad_through_cache)
        return layout.from_grouped_items(out, b, h)

    def means_kernel(self, values: Tensor) -> str:
        """The kernel of the cache's running means of ``values (B, Hk, R, L, d_v)``: ``triton``
        (:mod:`.fused.prefix`) where the layer's ``kernel`` is ``triton``, or ``auto`` on CUDA (at any value width:
        one product per block, no scores recomputed), and it can run; else ``plain`` (the reference)."""
        fused = self.kernel == "triton" or (self.kernel == "auto" and values.is_cuda)
        return "triton" if fused and why_not(values, self.codebook_size) is None else "plain"

    def window_kernel(self, q: Tensor, k: Tensor, v: Tensor, per_item: bool) -> str:
        """The kernel of one window + cache call (``triton``, ``flex`` or ``plain``) by the layer's ``kernel``, for
        queries ``q`` and the keys ``k`` and values ``v`` of its windows (their head dims and gradients count, not
        their layout; ``per_item``: a per-item codebook, which flex does not read). On CUDA ``auto`` takes the fused
        kernels (:func:`wants_triton`) or the plain one, never flex: the values the fused kernels leave (wider than
        two chunks: the GAU's 1536) are the plain kernel's GEMMs' best case, and compiled flex is untried at such
        widths on a GPU."""
        if wants_triton(self.kernel, q, v.shape[-1]):
            return "triton"
        options = FlexSupport(False, "kernel=auto on CUDA") if q.device.type == "cuda" else FlexSupport(True)
        return "flex" if not per_item and wants_flex(self.kernel, self, q, k, v, options) else "plain"

    def _cache_keys(
        self, batch: int, key_means: Tensor | None, first: int, last: int, dtype: torch.dtype
    ) -> Tensor:
        """The keys the cache is read by, ``(B·Hk, S, d_k)`` or per item ``(B·Hk, I, S, d_k)``: the codes, detached
        (official); with ``cache_code_grad`` (training) per item, taking the cache scores' gradient; with
        ``cache_key_grad`` ``C + m - sg(m)``, ``m`` the running key means (the same scores, a gradient to the
        cached keys); with ``cache_keys="mean"`` the running means ``m`` of the raw keys themselves."""
        entries = None if key_means is None else item_entries(key_means.flatten(0, 1), first, last, dtype)
        if self.mean_keys:
            return entries
        codebook = self.quantizer.codebook.to(dtype)
        if not (self.cache_code_grad and torch.is_grad_enabled()):
            codebook = codebook.detach()
        codebook = codebook[None].expand(batch, -1, -1, -1).flatten(0, 1)
        if entries is not None:
            return codebook[:, None] + (entries - entries.detach())
        if codebook.requires_grad:  # per item: the kernels return a per-item codebook's gradient
            items = last - first + 1
            return codebook[:, None].expand(-1, items, -1, -1)
        return codebook

    def _next_state(
        self,
        keys: Tensor,
        values: Tensor,
        codes: Tensor,
        prefix: CacheMeans | None,
        t0: int,
        t_new: int,
        p0: int,
    ) -> VQState:
        """State after position ``t0 + t_new``; ``p0`` is the (block-aligned) position of ``keys[:, :, 0]``.

        Every tensor a copy of its cut in standard strides (:func:`~tvq_exp.attention.base.own_copy`; the cache
        means' entry is a tensor of its own already): the state keeps the window, not the call's keys and values it
        was cut from (a view would hold them until the next call), and its strides are the same at every position (a
        compiled block guards on them: a view's depend on the call's layout)."""
        t_end = t0 + t_new
        start = window_start(t_end, self.block_len)
        j = self._newest_entry(t_end, p0)
        state = VQState(
            position=t_end,
            k=own_copy(keys[:, :, start - p0 :].detach()),
            v=own_copy(values[:, :, start - p0 :].detach()),
            codes=own_copy(codes[:, :, start - p0 :]),
        )
        if prefix is not None:
            heads = keys.shape[:2]
            state.cache_n = own_copy(prefix.counts[:, j].unflatten(0, heads))
            state.cache_mu = prefix.state.unflatten(0, heads)  # (the means' own tensor)
        return state

    def _newest_entry(self, t_end: int, p0: int) -> int:
        """The prefix entry (of this call's blocks, ``p0`` the position of its first) of the cache after ``t_end``."""
        L = self.block_len
        return max(t_end // L - 2 - p0 // L + 1, 0)  # one past the newest cached block

    def _next_keys(self, raw: Tensor, key_means: Tensor, t_end: int, p0: int) -> tuple[Tensor, Tensor]:
        """``cache_keys="mean"``'s part of the state after ``t_end``: the window's raw keys and the key means."""
        start = window_start(t_end, self.block_len) - p0
        return (
            own_copy(raw[:, :, start:].detach()),
            own_copy(key_means[:, :, self._newest_entry(t_end, p0)].detach()),
        )


def _to_blocks(
    keys: Tensor, values: Tensor, codes: Tensor, block_len: int
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Pad ``(B, Hk, n, ·)`` keys, values and codes to whole blocks: ``(B, Hk, R, L, ·)``, with the
    ``(R, L)`` mask of real (unpadded) positions."""
    n = codes.shape[2]
    r = -(-n // block_len)
    valid = torch.arange(r * block_len, device=codes.device) < n
    cb = _pad_blocks(codes[..., None], block_len)[..., 0]
    return _pad_blocks(keys, block_len), _pad_blocks(values, block_len), cb, valid.view(r, block_len)


def _join(carried: Tensor, new: Tensor) -> Tensor:
    """A carried state's positions ``(B, Hk, n0, ·)`` then the call's ``(B, Hk, n, ·)``, in the call's dtype (the call's
    tensor itself, not a copy, when nothing is carried)."""
    return new if carried.shape[2] == 0 else torch.cat([carried.to(new.dtype), new], dim=2)


def _pad_blocks(x: Tensor, block_len: int) -> Tensor:
    """``x (B, Hk, n, d)`` padded with zeros to whole blocks: ``(B, Hk, R, L, d)`` (a view when ``n`` is whole
    blocks)."""
    r = -(-x.shape[2] // block_len)
    pad = r * block_len - x.shape[2]
    return (torch.nn.functional.pad(x, (0, 0, 0, pad)) if pad else x).unflatten(2, (r, block_len))


def _code_means(codes: Tensor, keys: Tensor, valid: Tensor, n0: Tensor, mean0: Tensor) -> Tensor:
    """Running means per code ``(B, Hk, R + 1, S, d)`` of block-aligned ``keys (B, Hk, R, L, d)`` with ``codes
    (B, Hk, R, L)``, seeded with a carried state's counts ``n0`` and means ``mean0`` ``(B, Hk, S, ·)``."""
    means = running_code_means(
        codes.flatten(0, 1), keys.flatten(0, 1), valid, n0.flatten(0, 1), mean0.flatten(0, 1)
    )
    return means[1].unflatten(0, codes.shape[:2])
