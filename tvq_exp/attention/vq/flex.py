"""Transformer-VQ's window + cache step through :func:`torch.nn.attention.flex_attention`.

The same function as :func:`tvq_exp.attention.vq.kernel.window_cache_attention` (same arguments, same
result), laid out for flex attention: every **item** (one query block) is one batch entry whose keys are
its ``W`` window keys followed by the ``S`` codes, and whose values are the window values followed by the
item's cache means. One ``score_mod`` adds the window term (the XL bias looked up in the row's table
``[(q + v)·r_0 .. (q + v)·r_M, 0, -inf]``, as the plain kernel) or the code's ``log n_s``; the causal part
of the window is a block mask shared by all items, so flex skips the key blocks no query of a query block
can see. Flex's fused kernel keeps the ``R × (W + S)`` scores out of memory, as the plain kernel's chunks do.
The ``score_mod`` and the mask compute each key's table column from its distance to the row
(:class:`~tvq_exp.attention.vq.kernel.WindowIndex`), as the fused Triton kernels do: they load no index table
(an int64 ``(BLOCK_M, BLOCK_N)`` tile per key tile, more bytes than the keys and values it sat beside).

Where it runs (:func:`tvq_exp.attention.flex_runtime.flex_support`): compiled on CUDA for heads of at least 16
(torch's CUDA kernel), compiled and forward-only on CPU (torch 2.14 has no compiled CPU backward); with gradients
on CPU, or narrower heads on CUDA, it runs flex's eager form, which
materialises each item's scores (exact; a reference, slower than the plain kernel). ``kernel=auto`` in
:class:`~tvq_exp.attention.vq.layer.VQAttention` therefore takes it only where the compiled kernel runs, and not on
CUDA, where it takes the fused Triton kernels or the plain one
(:meth:`~tvq_exp.attention.vq.layer.VQAttention.window_kernel`).

Shapes: ``q (N, I, R, d_k)`` (``R = G·Lq`` rows: ``G`` grouped heads of ``Lq`` positions), ``kb, vb
(N, I + 1, L, d)`` (two-block windows) or ``(N, I, L, d)`` (one-block), ``index`` (:class:`~tvq_exp.attention.vq.kernel.WindowIndex`), the optional
:class:`~tvq_exp.attention.vq.kernel.WindowBias` and :class:`~tvq_exp.attention.vq.kernel.CodeCache` groups (their
shapes there) -> ``(N, I, R, d_v)``.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from tvq_exp.attention.base import accumulation_dtype
from tvq_exp.attention.flex_runtime import create_block_mask, flex_attention, kernel_options, run_flex
from tvq_exp.attention.vq.kernel import WindowIndex, WindowInputs, window_index


def flex_window_cache_attention(
    inputs: WindowInputs, prev_grad: bool = True, compiled: bool | None = None
) -> Tensor:
    """:func:`~tvq_exp.attention.vq.kernel.window_cache_attention` through flex attention (see the module
    doc for shapes).

    Args:
        inputs, prev_grad: as :func:`~tvq_exp.attention.vq.kernel.window_cache_attention`.
        compiled: the fused kernel (True), the eager implementation (False), or None: fused unless it cannot
            run here (CPU with gradients), then eager.

    Raises :class:`~tvq_exp.attention.flex_runtime.FlexUnsupported` with the reason when flex cannot run.
    """
    q, kb, vb, index, bias, cache, prev_masked = inputs
    bias_q, rel = (None, None) if bias is None else bias
    codebook, log_n, mu = (None, None, None) if cache is None else cache
    n, items, rows, _ = q.shape
    blocks, block = kb.shape[1] - items + 1, kb.shape[2]

    def window(x: Tensor, j: int) -> Tensor:
        part = x[:, j : j + items]
        return part.detach() if j == 0 and blocks == 2 and not prev_grad else part

    keys = [window(kb, j) for j in range(blocks)]
    values = [window(vb, j) for j in range(blocks)]
    if codebook is not None:
        keys.append(codebook[:, None].to(kb.dtype).expand(n, items, *codebook.shape[1:]))
        values.append(mu.to(vb.dtype))
    k, v = (torch.cat(x, dim=2).flatten(0, 1)[:, None] for x in (keys, values))  # (N·I, 1, W [+ S], d)
    acc = accumulation_dtype(q.dtype)
    table = _window_table(bias_q, rel, rows, acc, q.device)  # (N·I, R, M + 3), or (1, 1, 2) without the bias
    cache = (
        q.new_zeros(1, 1, dtype=acc) if log_n is None else log_n.to(acc).flatten(0, 1)
    )  # (N·I, S): log counts
    mask = _block_mask(index, rows // index.rows, k.shape[2], str(q.device))
    args = (q.flatten(0, 1)[:, None], k, v, mask, table, index, cache, log_n is not None, items, block,
            prev_masked)  # fmt: skip
    out = run_flex(_kernel, args, compiled)
    return out.view(n, items, rows, -1)


def _window_table(
    bias_q: Tensor | None, rel: Tensor | None, rows: int, acc: torch.dtype, device: torch.device
) -> Tensor:
    """Every row's window terms: ``[(q + v)·r_0 .. (q + v)·r_M, 0, -inf]`` ``(N·I, R, M + 3)``; without the
    bias the shared ``[0, -inf]`` as ``(1, 1, 2)``."""
    if rel is None or bias_q is None:
        return torch.tensor([[[0.0, float("-inf")]]], dtype=acc, device=device)
    n, items, g = bias_q.shape[0], bias_q.shape[1], rel.shape[1]
    bq = bias_q.reshape(n, items, g, rows // g, -1)
    logits = (bq @ rel[:, None].transpose(-1, -2)).reshape(n * items, rows, -1).to(acc)
    edge = logits.new_tensor([0.0, float("-inf")]).expand(*logits.shape[:-1], 2)
    return torch.cat([logits, edge], dim=-1)


def _columns(index: WindowIndex, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
    """The table column of window key ``kv_idx`` for flex row ``q_idx`` (``heads`` groups of ``index.rows`` rows,
    the same window for each): :meth:`WindowIndex.table` computed where it is read. Codes (``kv_idx >= W``) get a
    column too; the callers do not use it."""
    return window_index(index.first + q_idx % index.rows - kv_idx, index.max_distance, index.span)


@functools.lru_cache(maxsize=32)
def _block_mask(index: WindowIndex, heads: int, columns: int, device: str):  # noqa: ANN202
    """The causal window as a block mask, shared by every item and head (cached per layout, ``heads`` groups of
    ``index.rows`` rows): window key ``j`` of row ``r`` is visible unless its column is the ``-inf`` one; the
    codes always are."""
    masked = (-1 if index.max_distance is None else index.max_distance) + 2  # window_index's -inf column

    def mask_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return (kv_idx >= index.width) | (_columns(index, q_idx, kv_idx) != masked)

    return create_block_mask(mask_mod, None, None, heads * index.rows, columns, device=device)


def _kernel(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: object,
    table: Tensor,
    index: WindowIndex,
    cache: Tensor,
    has_cache: bool,
    items: int,
    block: int,
    prev_masked: bool,
) -> Tensor:
    width = index.width
    per_row = table.shape[0] > 1  # a table per item and row (the XL bias), else the shared [0, -inf]

    def score_mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        in_window = kv_idx < width
        column = _columns(index, q_idx, kv_idx.clamp(max=width - 1))
        term = table[b, q_idx, column] if per_row else table[0, 0, column]
        if has_cache:
            term = torch.where(in_window, term, cache[b, (kv_idx - width).clamp(min=0)])
        if prev_masked:  # item 0 has no previous block: its first L window keys are masked
            hidden = (b % items == 0) & (kv_idx < block)
            term = torch.where(hidden, torch.full_like(term, float("-inf")), term)
        return score + term

    return flex_attention(
        q, k, v, score_mod=score_mod, block_mask=mask, scale=1.0, kernel_options=kernel_options(q, k, v)
    )


__all__ = ["flex_window_cache_attention"]
