"""The fused window + cache step of Transformer-VQ attention: chunked, recomputed in the backward.

Over 300 lines: the forward and the backward share one set of per-chunk pieces (the fp32 logits from the
window views and the codes, the weighted values, the bias lookup) and its inputs' layout; the plain
reference is in ``naive.py``.

Each **item** is one query block: ``R = G·Lq`` query rows (``G`` grouped query heads stacked, ``Lq``
positions) that attend to

- the **window**: key blocks ``i`` (the previous block) and ``i + 1`` (the block of the queries),
  ``2L`` keys (or, for a one-block window, block ``i`` alone: a sequence's first block with nothing
  before it). Their additive term is looked up by ``index`` (:class:`WindowIndex`: a column per query row and
  window key, by their distance) in the row's table ``[(q + v)·r_0 .. (q + v)·r_M, 0, -inf]``: the XL bias
  inside the window (distances ``0..M``), zero beyond it, ``-inf`` for the causal mask. Without the bias the
  table is ``[0, -inf]``.
- the **cache**: the ``S`` codes, additive term ``log n_s``, with the cache means as values.

One softmax over ``[window; cache]`` per row (its row max is the paper's shared stop-gradient max)
and ``out = Σ p·[values; means]``.

The forward walks the items in chunks small enough to stay in the processor's cache and keeps only
its inputs and the output; the backward recomputes each chunk's probabilities, as flash attention
does. Nothing of size ``T·(2L + S)`` or ``T·M`` is ever materialised: memory is
``O(T·(d_k + d_v))`` and the memory traffic per token does not grow with the sequence length.
:func:`tvq_exp.attention.vq.naive.window_cache_attention` is the same function written plainly (full tensors, autograd); the
tests hold the two equal, forward and every gradient.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import torch
from torch import Tensor

from tvq_exp.attention.base import accumulation_dtype

# the plain kernel's XL distance table has a multiple of this many columns on a device type (1 where not named)
XL_TABLE_ALIGN = {"cuda": 8}
# working-set budget of one chunk of items (the fp32 scores of all its rows): cache-sized on a CPU;
# large on a GPU, where fewer and bigger kernels win
CHUNK_BYTES = {"cpu": 4 << 20, "cuda": 1 << 30}


class WindowBias(NamedTuple):
    """The XL bias inside the window: the bias ``queries`` ``q + v`` ``(N, I, R, d_k)`` and the projected relative
    embeddings ``rel (N, G, M + 1, d_k)`` (``G`` heads per item row group). Both take gradients."""

    queries: Tensor
    rel: Tensor


class CodeCache(NamedTuple):
    """The compressive cache every item's queries see: the ``codebook (N, S, d_k)`` (or per item ``(N, I, S, d_k)``,
    taking the cache scores' gradient: ``cache_key_grad``) and the items' log code counts
    ``log_n (N, I, S)`` (``-inf`` for empty codes), neither with a gradient, and their means ``mu (N, I, S, d_v)``
    (the values of the codes)."""

    codebook: Tensor
    log_n: Tensor
    mu: Tensor


class WindowIndex(NamedTuple):
    """Which table column each window key takes, from its distance to the query row: row ``p`` (of ``rows``, the
    queries' positions ``Lq``) and window key ``j`` (of ``width``, ``W``) are ``first + p - j`` apart
    (:func:`window_index` gives the column of a distance). The same for every head and item; the fused kernels
    compute it from these numbers, the others read :meth:`table`.

    Fields:
        first: the distance of row 0 to window key 0 (``L`` plus the queries' offset in their block; the
            offset alone for a one-block window).
        rows, width: ``Lq`` and ``W`` (``2L``, or ``L`` for a one-block window).
        max_distance: the XL bias's last distance ``M``, or None (no bias).
        span: a sliding window: keys farther than ``span`` masked; None: none.
    """

    first: int
    rows: int
    width: int
    max_distance: int | None = None
    span: int | None = None

    @classmethod
    def of_block(
        cls, block_len: int, offset: int, rows: int, one_block: bool,
        max_distance: int | None = None, span: int | None = None,
    ) -> WindowIndex:  # fmt: skip
        """The window of ``rows`` queries from position ``offset`` of a block of ``block_len``: over the previous
        block and their own (``one_block``: their own alone)."""
        first, width = (offset, block_len) if one_block else (block_len + offset, 2 * block_len)
        return cls(first, rows, width, max_distance, span)

    def table(self, device: torch.device | str | None = None) -> Tensor:
        """``(rows, width)`` int64: the column of every window key (:func:`window_index`)."""
        p = torch.arange(self.rows, device=device)[:, None]
        j = torch.arange(self.width, device=device)[None, :]
        return window_index(self.first + p - j, self.max_distance, self.span)

    def keys(self, device: torch.device | str | None = None) -> Tensor:
        """``(rows, M + 1)`` int64: the window key at each bias distance ``d = 0..M`` of every row (``first + p - d``),
        ``-1`` where the window has none or masks it: :meth:`table` inverted on its columns ``0..M``, each of which
        a row's keys take once at most. Needs ``max_distance``."""
        p = torch.arange(self.rows, device=device)[:, None]
        d = torch.arange(self.max_distance + 1, device=device)[None, :]
        j = self.first + p - d
        gone = (j < 0) | (j >= self.width)
        if self.span is not None:
            gone |= d > self.span
        return j.masked_fill(gone, -1)


class WindowInputs(NamedTuple):
    """What every window + cache kernel takes (this module's, its plain reference in ``naive.py``, flex's).

    Fields:
        q: content queries ``(N, I, R, d_k)``; ``R = G·Lq`` rows (``G`` heads of ``Lq`` positions).
        kb, vb: key / value blocks ``(N, I + 1, L, d)``: item ``i`` sees blocks ``i`` and ``i + 1``;
            or ``(N, I, L, d)``, a one-block window: item ``i`` sees block ``i``. The fused kernels
            (:func:`~tvq_exp.attention.vq.fused.op.fused_window_cache_attention`) also take ``(N, I, L, d)`` for a
            two-block window with ``prev_masked``: item ``i`` sees blocks ``i - 1`` and ``i``.
        index: the table column of each of the ``W = 2L`` (or ``L``) window keys of the ``Lq`` rows
            (:class:`WindowIndex`; the same for every head and item).
        bias: the XL bias (:class:`WindowBias`), or None.
        cache: the compressive cache (:class:`CodeCache`), or None; its codebook is ``(N, S, d_k)`` (no
            gradient) or per item ``(N, I, S, d_k)`` (its gradient is the cache scores' gradient, item by item:
            ``VQAttention(cache_key_grad=True)``).
        prev_masked: item 0 has no previous block (its first ``L`` window keys are masked).
    """

    q: Tensor
    kb: Tensor
    vb: Tensor
    index: WindowIndex
    bias: WindowBias | None = None
    cache: CodeCache | None = None
    prev_masked: bool = False


def window_cache_attention(inputs: WindowInputs, chunk: int | None = None, prev_grad: bool = True) -> Tensor:
    """Attention of every item's queries over its two-block window and the compressive cache (``inputs``).

    Args:
        chunk: items per chunk (default: :data:`CHUNK_BYTES` of fp32 scores).
        prev_grad: False: the previous block's keys and values (in a two-block window) take no gradient
            from these queries, as the official code's stop-gradient on the carried state (no gradient
            through the cache).

    Returns ``(N, I, R, d_v)``. Gradients flow to ``q, kb, vb``, the bias's queries and embeddings, the
    cache's means and a per-item codebook.
    """
    q, kb, vb, index, bias, cache, prev_masked = inputs
    bias_q, rel = (None, None) if bias is None else bias
    codebook, log_n, mu = (None, None, None) if cache is None else cache
    if chunk is None:
        window = (kb.shape[1] - q.shape[1] + 1) * kb.shape[2]
        chunk = default_chunk(q, window + (0 if codebook is None else codebook.shape[-2]))
    keys = None if bias is None else index.keys(q.device)
    return _WindowCache.apply(
        q, kb, vb, index.table(q.device), keys, bias_q, rel, codebook, log_n, mu, prev_masked, chunk, prev_grad
    )  # fmt: skip


def default_chunk(q: Tensor, columns: int) -> int:
    """Items per chunk so that one chunk's fp32 scores (``columns`` per row) fit :data:`CHUNK_BYTES`
    of ``q``'s device."""
    budget = CHUNK_BYTES.get(q.device.type, CHUNK_BYTES["cuda"])
    per_item = 4 * q.shape[0] * q.shape[2] * columns
    return max(1, budget // per_item)


def window_index(distance: Tensor, max_distance: int | None, span: int | None = None) -> Tensor:
    """Table columns of window keys at ``distance`` (query minus key): ``d`` inside the bias window
    ``0..M``, ``M + 1`` (zero) beyond it, ``M + 2`` (``-inf``) for future keys and, with ``span``, for
    keys farther than ``span`` (a sliding window). ``max_distance`` None: no bias, columns ``0``
    (visible) and ``1`` (masked)."""
    m = -1 if max_distance is None else max_distance
    masked = distance < 0 if span is None else (distance < 0) | (distance > span)
    return distance.clamp_max(m + 1).masked_fill(masked, m + 2)


class _WindowCache(torch.autograd.Function):
    """Forward and backward of :func:`window_cache_attention`, chunk by chunk. Autocast is off
    inside: matmuls take the inputs' dtype; logits (products included), softmax and their gradients are fp32
    (fp64 for fp64 inputs)."""

    @staticmethod
    def forward(ctx, q, kb, vb, index, keys, bias_q, rel, codebook, log_n, mu, prev_masked, chunk, prev_grad):  # noqa: ANN001
        with torch.autocast(q.device.type, enabled=False):
            parts = ChunkParts(q, kb, vb, index, bias_q, rel, codebook, log_n, mu, prev_masked, keys)
            out = q.new_empty(*q.shape[:3], vb.shape[-1], dtype=vb.dtype)
            for i0, i1 in _chunks(q.shape[1], chunk):
                parts.weighted_values(parts.probabilities(i0, i1), i0, i1, out[:, i0:i1])
        # the means as the products took them (in the values' dtype: half an fp32 copy's bytes under bf16-mixed);
        # their gradient is made in mu's dtype
        ctx.save_for_backward(q, kb, vb, index, keys, bias_q, rel, codebook, log_n, parts.means, out)
        ctx.prev_masked, ctx.chunk, ctx.prev_grad = prev_masked, chunk, prev_grad
        ctx.mu_dtype = None if mu is None else mu.dtype
        return out

    @staticmethod
    def backward(ctx, grad_out):  # noqa: ANN001
        q, kb, vb, index, keys, bias_q, rel, codebook, log_n, means, out = ctx.saved_tensors
        with torch.autocast(q.device.type, enabled=False):
            parts = ChunkParts(q, kb, vb, index, bias_q, rel, codebook, log_n, means, ctx.prev_masked, keys)
            dq, dkb, dvb, dbq, drel, dcode, dmu = parts.backward(
                grad_out.contiguous(), out, ctx.chunk, ctx.needs_input_grad[9], ctx.prev_grad,
                ctx.needs_input_grad[7] and codebook.dim() == 4,
            )  # fmt: skip
        dmu = None if dmu is None else dmu.to(ctx.mu_dtype)  # the products' values: exact in either dtype
        return dq, dkb, dvb, None, None, dbq, drel, dcode, None, dmu, None, None, None


def _matmul(a: Tensor, b: Tensor, out: Tensor, add: bool = False) -> None:
    """``out = a @ b`` (``add``: ``out += a @ b``), accumulated and written in ``out``'s dtype: the fp32 product
    of bf16 operands is never rounded to bf16 (cuBLAS writes it in fp32; on a CPU, or for operands of two dtypes,
    such as bf16 queries and fp32 unit-norm keys under autocast, the operands are widened)."""
    if a.dtype != out.dtype and a.dtype == b.dtype and a.is_cuda:
        flat = (x.reshape(-1, *x.shape[-2:]) for x in (a, b))
        prod = torch.bmm(*flat, out_dtype=out.dtype).view(out.shape)
    else:
        a, b = a.to(out.dtype), b.to(out.dtype)
        if not add and not torch.compiler.is_compiling():  # dynamo takes no non-contiguous out=
            torch.matmul(a, b, out=out)
            return
        prod = a @ b
    if add:
        out += prod
    else:
        out.copy_(prod)


class ChunkParts:
    """The tensors of one call (:class:`WindowInputs`' fields, flat) and the per-chunk pieces shared by the
    forward and the backward: items ``i0..i1-1``' weights ``(N, c, R, W [+ S])`` (:meth:`probabilities`), their
    values' product and the gradient of their logits (:meth:`logit_grad`).

    Item ``i``'s window (blocks ``i..i + blocks - 1``) is a run of consecutive rows of the blocks: every item's
    keys and values are views (``unfold``) of ``kb`` and ``vb``, never copies, and the products with the window
    and with the codes are separate matmuls into one row of logits. With the XL bias, ``keys`` is the window's
    :meth:`WindowIndex.keys` (the key at each distance of a row), for the distance logits' gradient."""

    def __init__(
        self,
        q: Tensor,
        kb: Tensor,
        vb: Tensor,
        index: Tensor,
        bias_q: Tensor | None,
        rel: Tensor | None,
        codebook: Tensor | None,
        log_n: Tensor | None,
        mu: Tensor | None,
        prev_masked: bool,
        keys: Tensor | None = None,
    ) -> None:
        self.q, self.kb, self.vb, self.bias_q, self.rel = q, kb, vb, bias_q, rel
        self.codebook, self.log_n, self.prev_masked, self.mu = codebook, log_n, prev_masked, mu
        self.means = None if mu is None else mu.to(vb.dtype)  # the cache's values, in the values' dtype
        self.acc = accumulation_dtype(q.dtype)
        self.n, self.rows, self.block = q.shape[0], q.shape[2], kb.shape[2]
        self.blocks = kb.shape[1] - q.shape[1] + 1  # blocks per window: 2, or 1 for a lone first block
        self.width = self.blocks * self.block  # W
        self.columns = self.width + (0 if codebook is None else codebook.shape[-2])
        # (N, I, d_k, W) and (N, I, W, d_v): item i's keys (transposed) and values
        self.keys_t = kb.flatten(1, 2).unfold(1, self.width, self.block)
        self.values = vb.flatten(1, 2).unfold(1, self.width, self.block).transpose(-1, -2)
        self.index = index.repeat(self.rows // index.shape[0], 1)  # (R, W): the same for every head
        if rel is None:  # the table [0, -inf] of every row: its masked keys
            self.masked = self.index == 1
        else:  # (R, M + 1): the window key at each distance of a row (WindowIndex.keys), and where there is none
            # the distance table: M + 1 products, its 0 and -inf columns, and on CUDA zero columns to a multiple of 8
            # (XL_TABLE_ALIGN), computed by the products with zero rows of rel past M + 1: every product with it then
            # has 16-byte aligned rows in bf16 (cuBLAS took a slow unaligned kernel at M + 1 = 513 on an H200: 5.7 of
            # the paper step's 257 device ms). Elsewhere the products take the M + 1 columns alone.
            m1, align = rel.shape[2], XL_TABLE_ALIGN.get(q.device.type, 1)
            self.distances = m1 + 2 + (-(m1 + 2) % align)
            self.products = self.distances if align > 1 else m1
            self.rel_padded = torch.nn.functional.pad(rel, (0, 0, 0, self.products - m1))
            keys = torch.nn.functional.pad(
                keys.repeat(self.rows // keys.shape[0], 1), (0, self.products - m1), value=-1
            )
            self.distance_keys, self.no_key = keys.clamp_min(0), keys < 0

    def _expand(self, x: Tensor, c: int) -> Tensor:
        return x.expand(self.n, c, *x.shape[-2:])

    def distance_logits(self, i0: int, i1: int) -> Tensor:
        """The table :func:`window_index` indexes, of items ``i0..i1-1``, in fp32: ``(N, c, R, ·)`` (per head of the
        rows), ``(q + v)·r_d`` at distances ``d = 0..M``, then ``0`` (beyond the bias window) and ``-inf`` (masked),
        then on CUDA the padding's zeros."""
        n, c, g, m1 = self.n, i1 - i0, self.rel.shape[1], self.rel.shape[2]
        bq = self.bias_q[:, i0:i1].reshape(n, c, g, -1, self.bias_q.shape[-1])
        dl = bq.new_empty(n, c, g, bq.shape[3], self.distances, dtype=self.acc)
        _matmul(
            bq, self.rel_padded[:, None].transpose(-1, -2).expand(n, c, -1, -1, -1), dl[..., : self.products]
        )
        dl[..., m1 : m1 + 2] = dl.new_tensor([0.0, float("-inf")])
        return dl.view(n, c, self.rows, -1)

    def window_logits(self, i0: int, i1: int) -> Tensor:
        """Additive window terms ``(N, c, R, W)`` of the XL bias."""
        return self.distance_logits(i0, i1).gather(-1, self._expand(self.index, i1 - i0))

    def _codes_product(
        self, a: Tensor, i0: int, i1: int, out: Tensor, transpose: bool = True, add: bool = False
    ) -> None:
        """``out (+)= a @ codebook^T`` (``transpose`` False: ``a @ codebook``) for the rows ``a (N, c, R, ·)`` of
        items ``i0..i1-1`` (one codebook: every item's rows in one product)."""
        code = self.codebook if self.codebook.dim() == 3 else self.codebook[:, i0:i1]
        code = code.transpose(-1, -2) if transpose else code
        if code.dim() == 4:
            _matmul(a, code, out, add)
        else:
            n, rows = self.n, (i1 - i0) * self.rows
            _matmul(a.reshape(n, rows, -1), code, out.view(n, rows, -1), add)

    def probabilities(self, i0: int, i1: int) -> Tensor:
        """Attention weights ``(N, c, R, W [+ S])`` of items ``i0..i1-1`` (fp32 logits, one softmax).

        Recomputing them in the backward (one fused softmax) is cheaper than keeping a log-sum-exp.
        """
        n, c, w = self.n, i1 - i0, self.width
        q = self.q[:, i0:i1]
        s = q.new_empty(n, c, self.rows, self.columns, dtype=self.acc)
        _matmul(q, self.keys_t[:, i0:i1], s[..., :w])
        if self.rel is None:
            s[..., :w].masked_fill_(self.masked, float("-inf"))
        else:
            s[..., :w] += self.window_logits(i0, i1)
        if self.codebook is not None:
            self._codes_product(q, i0, i1, s[..., w:])
            s[..., w:] += self.log_n[:, i0:i1, None, :].to(self.acc)
        if self.prev_masked and i0 == 0:
            s[:, 0, :, : self.block] = float("-inf")
        return torch.softmax(s, dim=-1)

    def weighted_values(self, p: Tensor, i0: int, i1: int, out: Tensor) -> None:
        """``out = p·[window values; means]`` of items ``i0..i1-1`` (the weights in the values' dtype)."""
        p, w = p.to(self.vb.dtype), self.width
        acc = out if out.dtype == self.acc else torch.empty_like(out, dtype=self.acc)
        _matmul(p[..., :w], self.values[:, i0:i1], acc)
        if self.means is not None:
            _matmul(p[..., w:], self.means[:, i0:i1], acc, add=True)
        if acc is not out:
            out.copy_(acc)

    def backward(
        self,
        grad_out: Tensor,
        out: Tensor,
        chunk: int,
        want_mu: bool,
        prev_grad: bool = True,
        want_code: bool = False,
    ) -> tuple[Tensor | None, ...]:
        """Gradients w.r.t. ``q, kb, vb, bias_q, rel`` and (``want_code``) a per-item ``codebook`` and
        (``want_mu``) ``mu``, chunk by chunk; without ``prev_grad`` none reaches a two-block window's
        previous block."""
        q, L, w = self.q, self.block, self.width
        dq = torch.empty_like(q)
        dkb, dvb = torch.zeros_like(self.kb), torch.zeros_like(self.vb)
        dmu = torch.empty_like(self.mu) if want_mu else None
        dcode = torch.empty_like(self.codebook) if want_code else None
        dbq = None if self.rel is None else torch.empty_like(self.bias_q)
        drel = None if self.rel is None else torch.zeros_like(self.rel, dtype=self.acc)
        for i0, i1 in _chunks(q.shape[1], chunk):
            p = self.probabilities(i0, i1)
            do, qc = grad_out[:, i0:i1], q[:, i0:i1]
            p_low = p.to(do.dtype)
            dvw = p_low[..., :w].transpose(-1, -2) @ do  # (N, c, W, d_v)
            if dmu is not None:
                dmu[:, i0:i1] = p_low[..., w:].transpose(-1, -2) @ do
            ds = self.logit_grad(p, do, out[:, i0:i1], i0, i1)
            ds_low = ds.to(q.dtype)
            self._query_grad(ds_low, i0, i1, dq[:, i0:i1])
            dkw = ds_low[..., :w].transpose(-1, -2) @ qc  # (N, c, W, d_k)
            for j in range(0 if prev_grad or self.blocks == 1 else 1, self.blocks):
                dkb[:, i0 + j : i1 + j] += dkw[:, :, j * L : (j + 1) * L]
                dvb[:, i0 + j : i1 + j] += dvw[:, :, j * L : (j + 1) * L]
            if dcode is not None:
                dcode[:, i0:i1] = ds_low[..., w:].transpose(-1, -2) @ qc
            if drel is not None:
                self._bias_backward(ds_low[..., :w], i0, i1, dbq, drel)
        return dq, dkb, dvb, dbq, None if drel is None else drel.to(self.rel.dtype), dcode, dmu

    def logit_grad(self, p: Tensor, do: Tensor, out: Tensor, i0: int, i1: int) -> Tensor:
        """``dS = p·(dO·[values; means]^T − Σ dO·O)`` of items ``i0..i1-1``, formed in fp32."""
        w = self.width
        delta = (do.to(self.acc) * out.to(self.acc)).sum(-1, keepdim=True)
        ds = torch.empty_like(p)
        _matmul(do, self.values[:, i0:i1].transpose(-1, -2), ds[..., :w])
        if self.means is not None:
            _matmul(do, self.means[:, i0:i1].transpose(-1, -2), ds[..., w:])
        return ds.sub_(delta).mul_(p)

    def _query_grad(self, ds_low: Tensor, i0: int, i1: int, dq: Tensor) -> None:
        """``dq = dS·[window keys; codes]`` of items ``i0..i1-1``, accumulated in fp32."""
        w = self.width
        acc = dq if dq.dtype == self.acc else torch.empty_like(dq, dtype=self.acc)
        _matmul(ds_low[..., :w], self.keys_t[:, i0:i1].transpose(-1, -2), acc)
        if self.codebook is not None:
            self._codes_product(ds_low[..., w:], i0, i1, acc, transpose=False, add=True)
        if acc is not dq:
            dq.copy_(acc)

    def _bias_backward(self, ds_window: Tensor, i0: int, i1: int, dbq: Tensor, drel: Tensor) -> None:
        """The window logit gradients back to the distance logits, then to ``bias_q, rel``; the backward hands them
        over in the queries' dtype, as the products take them. A row's distance ``d`` is one window key's: its
        gradient is gathered, exactly as it is (a scatter would also add every key beyond ``M`` and every masked one
        into two dropped columns: on a GPU contended atomics). A gather commutes with the cast to the queries' dtype:
        gathering the cast gradient gives the same numbers, and compiled, the fp32 gradient is not written for the
        gather alone."""
        n, c, g, m1 = self.n, i1 - i0, self.rel.shape[1], self.rel.shape[2]
        ddl = ds_window.gather(-1, self._expand(self.distance_keys, c)).masked_fill_(self.no_key, 0.0)
        ddl = ddl.view(n, c, g, -1, self.products).to(self.q.dtype)  # (N, c, G, Lq, ·): 0 past M
        bq = self.bias_q[:, i0:i1].reshape(n, c, g, -1, self.bias_q.shape[-1])
        dbq[:, i0:i1] = (ddl @ self.rel_padded[:, None]).view(n, c, self.rows, -1)
        drel += (ddl.transpose(-1, -2) @ bq).sum(1)[:, :, :m1].to(drel.dtype)


def _chunks(items: int, chunk: int) -> Iterator[tuple[int, int]]:
    """``(start, stop)`` of consecutive chunks of ``chunk`` items."""
    for i0 in range(0, items, chunk):
        yield i0, min(items, i0 + chunk)


__all__ = [
    "CHUNK_BYTES",
    "ChunkParts",
    "CodeCache",
    "WindowBias",
    "WindowIndex",
    "WindowInputs",
    "default_chunk",
    "window_cache_attention",
    "window_index",
]
