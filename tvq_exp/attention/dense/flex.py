"""Dense attention through :func:`torch.nn.attention.flex_attention`: block masks, the windowed
Transformer-XL bias as a ``score_mod`` (the runtime, shared with Transformer-VQ's kernel, is
:mod:`tvq_exp.attention.flex_runtime`).

What flex can express for :class:`~tvq_exp.attention.dense.DenseAttention` (torch 2.14, checked on CPU):

- plain softmax, causal or not, with queries that start ``past`` positions after the keys and an
  optional sliding window: a :class:`BlockMask` (:func:`block_mask`);
- the XL bias ``(q_i + v)·r_{i-j}`` for ``0 <= i-j <= M`` (encoders: ``|i-j| <= M``): it depends on
  the query vector, so it is precomputed as a distance-logit table ``P = (q + v)·rᵀ`` of shape
  ``(B, H, Tq, M + 1)`` (encoders ``2M + 1``) and gathered inside the ``score_mod``
  (:func:`xl_score_mod`); gradients reach ``P`` (a captured tensor), hence ``u``, ``v`` and ``W_r``;
- ``d_v != d_k`` is fine.

What it cannot: ReLU² scores (flex always normalises ``exp(score)`` over the keys) and talking heads
(a ``score_mod`` sees one head's score at a time): :func:`dense_flex_support` says so, with a one-line reason.

Shapes: ``q (B, H, Tq, d_k)``, ``k (B, H, Tk, d_k)``, ``v (B, H, Tk, d_v)`` -> ``(B, H, Tq, d_v)``;
query ``i`` sits at position ``past + i``, key ``j`` at ``j``. No scaling of ``q·kᵀ`` (``scale=1``),
as every backend here (:mod:`tvq_exp.attention.base`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import Tensor

from tvq_exp.attention.flex_runtime import (
    BlockMask,
    FlexSupport,
    flex_attention,
    flex_support,
    kernel_options,
    run_flex,
)

ScoreMod = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]
MaskMod = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]


def dense_flex_support(
    device: torch.device | str,
    *,
    score: str = "softmax",
    talking_heads: bool = False,
    requires_grad: bool = False,
    compiled: bool = True,
) -> FlexSupport:
    """:func:`~tvq_exp.attention.flex_runtime.flex_support` for dense attention with these options: ``score``
    (``softmax`` or ``relu2``) and ``talking_heads`` (logits or weights mixed across heads) first."""
    if score != "softmax":
        return FlexSupport(
            False,
            f"{score} scores are not softmax: flex_attention always normalises exp(score) over the keys",
        )
    if talking_heads:
        return FlexSupport(
            False, "talking heads mix logits across heads: a flex score_mod sees one head's score at a time"
        )
    return flex_support(device, requires_grad=requires_grad, compiled=compiled)


def causal_mask_mod(past: int = 0, causal: bool = True, window: int | None = None) -> MaskMod:
    """The ``mask_mod`` of queries at ``past + i`` against keys at ``j``: visible when ``j <= past + i``
    (causal) and, with a ``window``, ``past + i - j <= window`` (encoders: ``|past + i - j| <= window``)."""

    def mask_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        distance = q_idx + past - kv_idx
        visible = distance >= 0 if causal else distance == distance
        if window is not None:
            visible = visible & ((distance <= window) if causal else (distance.abs() <= window))
        return visible

    return mask_mod


def block_mask(
    t_q: int,
    t_k: int,
    device: torch.device | str,
    *,
    past: int = 0,
    causal: bool = True,
    window: int | None = None,
) -> BlockMask | None:
    """The :class:`BlockMask` for ``t_q`` queries starting ``past`` positions after ``t_k`` keys (see
    :func:`causal_mask_mod`), shared by batch and heads; None when everything is visible (non-causal,
    no window). Cached per arguments."""
    if not causal and window is None:
        return None
    return _block_mask(t_q, t_k, str(torch.device(device)), past, causal, window)


SPARSE_BLOCK = 128  # flex's block size (torch's default), the rows and keys of one block of a BlockMask


@functools.lru_cache(maxsize=64)
def _block_mask(t_q: int, t_k: int, device: str, past: int, causal: bool, window: int | None) -> BlockMask:
    """:func:`block_mask`, from each block pair's range of distances ``past + i - j`` rather than from the
    elementwise ``(t_q, t_k)`` mask torch's ``create_block_mask`` evaluates (16 GiB at T = 128k, more than a
    device may give; these are ``(t_q/128, t_k/128)`` tensors). The same blocks, partial and full, as
    ``create_block_mask(causal_mask_mod(...))``: a block is full where every pair is visible and it lies whole
    inside the lengths (torch pads the last blocks with masked pairs)."""
    # visible: lo <= distance <= hi (non-causal masks come with a window: block_mask returns None without one)
    lo = 0 if causal else -window
    hi = float("inf") if window is None else window
    q0, k0 = (torch.arange(0, n, SPARSE_BLOCK, device=device) for n in (t_q, t_k))
    q1, k1 = ((x + SPARSE_BLOCK).clamp_max(n) - 1 for x, n in ((q0, t_q), (k0, t_k)))
    near = q0[:, None] + past - k1[None, :]  # each pair's smallest and largest distance
    far = q1[:, None] + past - k0[None, :]
    whole = ((q1 - q0 + 1 == SPARSE_BLOCK)[:, None]) & ((k1 - k0 + 1 == SPARSE_BLOCK)[None, :])
    every = (near >= lo) & (far <= hi) & whole
    partial = (far >= lo) & (near <= hi) & ~every
    return BlockMask.from_kv_blocks(
        *_ordered(partial), *_ordered(every), BLOCK_SIZE=SPARSE_BLOCK,
        mask_mod=causal_mask_mod(past, causal, window), seq_lengths=(t_q, t_k),
    )  # fmt: skip


def _ordered(blocks: Tensor) -> tuple[Tensor, Tensor]:
    """A ``(Q/128, K/128)`` bool block table as a BlockMask's ``(1, 1, Q/128)`` counts and ``(1, 1, Q/128, K/128)``
    key block indices: each row's blocks in order, then the others (as torch orders them)."""
    table = blocks.to(torch.int32)[None, None]
    count = table.sum(-1, dtype=torch.int32)
    return count, torch.argsort(table, dim=-1, descending=True, stable=True).to(torch.int32)


def xl_score_mod(distance_logits: Tensor, past: int = 0, causal: bool = True) -> ScoreMod:
    """The XL-bias ``score_mod``: adds ``P[b, h, i, d]`` for the distance ``d = past + i - j`` inside
    the window, 0 beyond.

    Args:
        distance_logits: ``P = (q + v)·rᵀ``: ``(B, H, Tq, M + 1)`` for distances ``0..M`` (causal), or
            ``(B, H, Tq, 2M + 1)`` for ``-M..M`` (encoders, index ``d + M``). Gradients flow to it.
        past: position of the first query minus that of the first key.
        causal: which table layout ``distance_logits`` has.
    """
    width = distance_logits.shape[-1]
    if causal:
        low, high, shift = 0, width - 1, 0
    else:
        if width % 2 == 0:
            raise ValueError(f"an encoder distance table has 2M + 1 columns, got {width}")
        low, high, shift = -(width // 2), width // 2, width // 2

    def score_mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        distance = q_idx + past - kv_idx
        inside = (distance >= low) & (distance <= high)
        bias = distance_logits[b, h, q_idx, distance.clamp(low, high) + shift]
        return score + torch.where(inside, bias, torch.zeros_like(bias))

    return score_mod


def _plain_kernel(q: Tensor, k: Tensor, v: Tensor, mask: BlockMask | None) -> Tensor:
    return flex_attention(q, k, v, block_mask=mask, scale=1.0, kernel_options=kernel_options(q, k, v))


def _xl_kernel(
    q: Tensor, k: Tensor, v: Tensor, mask: BlockMask | None, table: Tensor, past: int, causal: bool
) -> Tensor:
    # the score_mod is built inside the compiled function, so a new table never triggers a recompile
    return flex_attention(
        q,
        k,
        v,
        score_mod=xl_score_mod(table, past, causal),
        block_mask=mask,
        scale=1.0,
        kernel_options=kernel_options(q, k, v),
    )


def flex_dense_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool = True,
    past: int = 0,
    window: int | None = None,
    distance_logits: Tensor | None = None,
    compiled: bool | None = None,
) -> Tensor:
    """``softmax(q·kᵀ + bias + mask)·v`` through flex attention.

    Args:
        q, k, v: ``(B, H, Tq, d_k)``, ``(B, H, Tk, d_k)``, ``(B, H, Tk, d_v)`` (keys already repeated to
            every query head). Query ``i`` sits at position ``past + i``.
        causal: hide keys after each query.
        past: position of the first query minus that of the first key (``Tk - Tq`` for a carried state).
        window: also hide keys more than ``window`` positions before (encoders: away from) the query.
        distance_logits: the XL table (see :func:`xl_score_mod`), or None for no bias.
        compiled: the fused kernel (True), the eager implementation (False), or None: fused unless
            it cannot run here (CPU with gradients), then eager.

    Returns ``(B, H, Tq, d_v)``. Raises :class:`FlexUnsupported` with the reason when flex cannot run.
    """
    if not causal and past:
        raise ValueError("a past offset only makes sense for causal attention")
    mask = block_mask(q.shape[2], k.shape[2], q.device, past=past, causal=causal, window=window)
    if distance_logits is None:
        return run_flex(_plain_kernel, (q, k, v, mask), compiled)
    return run_flex(_xl_kernel, (q, k, v, mask, distance_logits, past, causal), compiled)


__all__ = [
    "block_mask",
    "causal_mask_mod",
    "dense_flex_support",
    "flex_dense_attention",
    "xl_score_mod",
]
