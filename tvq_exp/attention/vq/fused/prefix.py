"""The cache's running code means in Triton: :func:`fused_cache_means` computes
:func:`tvq_exp.attention.vq.cache.cache_means` (its plain reference; the tests hold the two equal), forward and
backward, without most of its intermediates.

The plain version scatters every block's values into ``(N, R, S, d_v)`` fp32 sums, widens them to fp64, takes the
cumulative sum over the blocks, divides and narrows again: at the GPU check's 32k tokens that is about 5 GB of
memory traffic for 272 MB of means (``(16, 65, 512, 128)`` fp32), and its backward another three passes (suffix sums
by flipping). Then the layer joins the entries its items read and casts them to the values' dtype: another pass over
them forward and two back.

Here the forward is a sort and two kernels. The sort orders each block's codes (stable), so that the positions of
``BS`` consecutive codes are one run. The first kernel takes every block at once (a program per block, ``BS`` codes
and ``BD`` value columns): it reads only its codes' run, and its per-code sums are one product on the tensor cores
(the run's one-hot codes times their values, gathered: exact products, fp32 sums), written once ``(N, R, S, d_v)``
fp32 with the blocks' counts. Its products cost ``L·BS·d_v`` a block and its values are read once per ``BD``
columns, where one product over every position cost ``L·S·d_v`` and read them once per ``BS`` codes (the paper
step's largest kernel on an H200 on 2026-11-30: 31 of its 257 device ms, at ``S = 512``, ``d_v = 1536``). The second walks
the blocks in order per sequence, codes and columns, adding each block's sums to running sums and counts held in
fp64 (the reference's accumulation; see :mod:`tvq_exp.attention.vq.cache`), and writes each entry's means once,
where the items read them, in the values' dtype (half an fp32 copy's bytes under bf16), with the one entry a carried
state keeps in fp32. The backward reads the items' gradient as it comes (bf16 under bf16 values), walks the blocks
back per codes and columns, carrying the suffix sum of ``∂L/∂μ / n`` in fp32 (the reference's) and writing it per
block in the values' dtype; then a kernel over every position at once gives each its code's row (a gather, exact):
no products, no atomics.

Why the split: one program walking the blocks and summing each (the first form) ran a chain of ``R·L/BT`` dependent
steps with a program or two per SM: on one H200 at 32k (2026-11-29) its forward took 2.8 ms and its backward (a
product per position over every code tile) 2.7 ms of VQ's 14 ms forward + backward. The walks now carry only loads
and adds, and the work per position runs with every block at once.

The kernels read the values where they lie: ``(N, R, L, d_v)`` or ``(B, Hk, R, L, d_v)`` (``N = B·Hk``) at any strides
whose blocks are cut from one time axis (a multi-head layer's ``(B, T, Hk, d_v)`` projection seen as ``(B, Hk, T,
d_v)``: no layout copy; other values are copied once, :func:`value_units`), and write their gradient dense in the
values' dim order (:func:`~tvq_exp.attention.vq.fused.support.gradient_strides`).

Runs on CUDA or on CPU under Triton's interpreter (``TRITON_INTERPRET=1``: the tests); values fp32, bf16 or fp16.
Two custom ops, ``tvq::code_means`` and ``tvq::code_means_backward`` (its gradient): ``torch.compile`` keeps them
in its graph.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import torch
from torch import Tensor

from tvq_exp.attention.vq.cache import CacheMeans
from tvq_exp.attention.vq.fused.support import block_units, extent, gradient_strides, unsupported
from tvq_exp.nn.triton_loader import cdiv, load_kernels

# per kernel, on sm_90a without spills (make kernel-report), the last two numbers warps and software-pipelining stages:
# the block sums' (codes, positions a step, value columns): a product row per code, 64 on 4 warps (each program reads
# only its codes' positions, so its product costs L·BS·d_v: fewer codes, less work); the walks' (codes, columns): small tiles, so that 32k tokens of 16 sequences make 512
# programs; the code rows' (positions, columns). The block sums' tiles are searched on a GPU by
# ``python -m tvq_exp.attention.vq.fused.tune`` (kernel ``block_sums``)
GPU_TILES: dict[str, tuple[int, ...]] = {
    "sums": (64, 32, 64, 4, 2), "forward": (32, 64, 4, 2), "backward": (32, 64, 4, 2), "rows": (64, 64, 4, 1),
}  # fmt: skip
# the interpreter's: the smallest, so that small tests cross every tile edge
INTERPRETED_TILES: dict[str, tuple[int, ...]] = {
    "sums": (16, 16, 16, 4, 1), "forward": (16, 16, 4, 1), "backward": (16, 16, 4, 1), "rows": (16, 16, 4, 1),
}  # fmt: skip
# sorted codes the block sums count a step (where a program's codes begin and end in its block's sorted codes): a
# block's 512 in two steps on the GPU; under the interpreter few, so that the tests' blocks take several
RUN_STEP = {False: 256, True: 8}


def kernel_tiles(interpret: bool, kernel: str) -> tuple[int, ...]:
    """The tiles of ``kernel`` (``sums``, ``forward``, ``backward`` or ``rows``; see :data:`GPU_TILES`), then its
    warps and stages: the interpreter's or the GPU's."""
    return (INTERPRETED_TILES if interpret else GPU_TILES)[kernel]


@functools.cache
def prefix_kernels(interpret: bool) -> ModuleType:
    """:mod:`.prefix_kernels`, decorated for the interpreter or for the GPU (looked up once per mode)."""
    return load_kernels(Path(__file__).with_name("prefix_kernels.py"), __package__, interpret)


def fused_cache_means(
    codes: Tensor, values: Tensor, valid: Tensor, n0: Tensor, mu0: Tensor, first: int, items: int, state: int
) -> CacheMeans:
    """:func:`~tvq_exp.attention.vq.cache.cache_means` in Triton (arguments and result there): every entry's counts,
    the ``items`` items' means from block ``first`` on, written once in the values' dtype, and entry ``state`` in
    fp32; gradients flow from the items' means to ``values``. The values ``(N, R, L, d_v)`` or ``(B, Hk, R, L, d_v)``
    (``N = B·Hk``, the codes ``(N, R, L)``) at any strides, read where they lie where the kernels can
    (:func:`value_units`).

    Raises ValueError (one line) where it cannot run (:func:`why_not`): not CUDA nor the interpreter, values not
    fp32, bf16 or fp16, or means past the kernels' int32 offsets."""
    reason = why_not(values, mu0.shape[-2])
    if reason:
        raise ValueError(f"running code means in Triton: {reason}")
    kept = torch.where(valid, codes, -1).to(torch.int32)  # -1: a padded position, counted nowhere
    return CacheMeans(*code_means(kept, values, n0.double(), mu0.float(), first, items, state))


def why_not(values: Tensor, codes: int) -> str | None:
    """Why :func:`fused_cache_means` cannot take ``values (N, R, L, d_v)`` or ``(B, Hk, R, L, d_v)`` with ``codes``
    codes (None: it can): the device or dtype (:func:`~tvq_exp.attention.vq.fused.support.unsupported`), or values
    (their extent where they lie: the largest offset the kernels read, plus one) or means too large for the kernels'
    int32 offsets."""
    reason = unsupported(values.device, values.dtype)
    if reason or values.dim() not in (4, 5):
        return reason or f"values of {values.dim()} dims, not (N, R, L, d_v) nor (B, Hk, R, L, d_v)"
    *heads, r, _, d = values.shape
    entries = max(values.numel(), extent(values), math.prod(heads) * (r + 1) * codes * d)
    return f"{entries} elements; the kernels' offsets are int32 (< 2**31)" if entries >= 2**31 else None


def value_units(shape: Sequence[int], stride: Sequence[int]) -> tuple[int, int, int, int] | None:
    """Where the kernels read values (or write their gradient) of ``shape`` ``(N, R, L, d_v)`` or ``(B, Hk, R, L,
    d_v)`` at ``stride`` in place: their heads ``Hk`` (1 for ``(N, R, L, d_v)``) and the unit strides of their
    batch, head and position (:func:`~tvq_exp.attention.vq.fused.support.block_units`); None where they cannot (the op
    copies them once)."""
    units = block_units(shape, stride)
    return None if units is None else (shape[1] if len(shape) == 5 else 1, *units)


def _in_place(values: Tensor) -> tuple[Tensor, tuple[int, int, int, int]]:
    """``values`` (or their one copy where the kernels cannot read them in place), their heads and unit strides
    (:func:`value_units`)."""
    layout = value_units(values.shape, values.stride())
    if layout is None:
        values = values.contiguous()
        layout = value_units(values.shape, values.stride())
    return values, layout


def _dot(values: Tensor, interpret: bool) -> tuple[object, str]:
    """The forward product's operand type and precision: the values' own (bf16, fp16), or fp32 (exact under the
    interpreter, three tf32 passes on a GPU)."""
    tl = prefix_kernels(interpret).tl
    if values.dtype == torch.float32 or interpret:
        return tl.float32, "ieee" if interpret else "tf32x3"
    return {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}[values.dtype], "tf32"


@torch.library.custom_op("tvq::code_means", mutates_args=(), device_types=("cpu", "cuda"))
def code_means(
    codes: Tensor, values: Tensor, n0: Tensor, mu0: Tensor, first: int, items: int, state: int
) -> tuple[Tensor, Tensor, Tensor]:
    """The forward kernels: ``codes (N, R, L)`` int32 (``-1`` at a padded position), ``values (N, R, L, d_v)`` or
    ``(B, Hk, R, L, d_v)`` (``N = B·Hk``, at any strides: read in place where :func:`value_units` allows, else
    copied once), the carried ``n0 (N, S)`` fp64 and ``mu0 (N, S, d_v)`` fp32 -> counts ``(N, R + 1, S)`` fp64, the
    means of ``items`` items from block ``first`` ``(N, items, S, d_v)`` in the values' dtype, and entry ``state`` of
    the means ``(N, S, d_v)`` fp32."""
    interpret = values.device.type == "cpu"
    n, r, length = codes.shape
    if values.dim() not in (4, 5) or math.prod(values.shape[:-3]) != n or values.shape[-3:-1] != (r, length):
        raise ValueError(f"values {tuple(values.shape)} for codes {tuple(codes.shape)}")
    values, layout = _in_place(values)
    s, d = mu0.shape[1], values.shape[-1]
    counts = n0.new_empty(n, r + 1, s)
    item_means = values.new_empty(n, items, s, d)
    state_means = mu0.new_empty(n, s, d)
    block_sums = mu0.new_empty(n, r, s, d)
    block_counts = mu0.new_empty(n, r, s)
    dot, prec = _dot(values, interpret)
    kernels = prefix_kernels(interpret)
    bs, bt, bd, warps, stages = kernel_tiles(interpret, "sums")
    # each block's codes sorted (stable: a code's values are summed in one order, run after run) and the positions in
    # that order: a code tile's positions are one run of them
    sorted_codes, order = codes.sort(dim=-1, stable=True)
    kernels.block_sums_kernel[(n * r * cdiv(s, bs) * cdiv(d, bd),)](
        sorted_codes, order, values, block_sums, block_counts, r, length, s, d, *layout,
        BS=bs, BT=bt, BD=bd, BC=RUN_STEP[interpret], DOT=dot, PREC=prec, num_warps=warps, num_stages=stages,
    )  # fmt: skip
    bs, bd, warps, stages = kernel_tiles(interpret, "forward")
    kernels.prefix_forward_kernel[(n, cdiv(s, bs), cdiv(d, bd))](
        block_sums, block_counts, n0.contiguous(), mu0.contiguous(), counts, item_means, state_means,
        r, s, d, first, items, state,
        BS=bs, BD=bd, num_warps=warps, num_stages=stages,
    )  # fmt: skip
    return counts, item_means, state_means


@code_means.register_fake
def _(
    codes: Tensor, values: Tensor, n0: Tensor, mu0: Tensor, first: int, items: int, state: int
) -> tuple[Tensor, Tensor, Tensor]:
    n, r, _ = codes.shape
    s, d = mu0.shape[1:]
    return n0.new_empty(n, r + 1, s), values.new_empty(n, items, s, d), mu0.new_empty(n, s, d)


@torch.library.custom_op("tvq::code_means_backward", mutates_args=(), device_types=("cpu", "cuda"))
def code_means_backward(
    grad_items: Tensor, codes: Tensor, counts: Tensor, first: int, dtype: torch.dtype, shape: Sequence[int],
    stride: Sequence[int],
) -> Tensor:  # fmt: skip
    """The backward kernels: the gradient of the values (``dtype``, ``shape`` ``(N, R, L, d_v)`` or ``(B, Hk, R, L,
    d_v)`` as the forward's values, dense in the dim order of their ``stride``: :func:`_values_gradient`) from that of
    the items' means ``(N, I, S, d_v)`` (any float dtype, read as it is), the items from block ``first``, and the
    forward's ``codes`` (int32, ``-1`` padded) and ``counts``."""
    interpret = codes.device.type == "cpu"
    n, r, length = codes.shape
    items, s, d = grad_items.shape[1:]
    # in the values' gradient's dtype: the code rows copy it as it is
    suffix = grad_items.new_empty(n, r, s, d, dtype=dtype)
    dv = _values_gradient(grad_items, dtype, shape, stride)
    kernels = prefix_kernels(interpret)
    bs, bd, warps, stages = kernel_tiles(interpret, "backward")
    kernels.prefix_backward_kernel[(n, cdiv(s, bs), cdiv(d, bd))](
        grad_items.contiguous(), counts.contiguous(), suffix, r, s, d, first, items,
        BS=bs, BD=bd, num_warps=warps, num_stages=stages,
    )  # fmt: skip
    bt, bd, warps, stages = kernel_tiles(interpret, "rows")
    kernels.code_rows_kernel[(n * r, cdiv(length, bt), cdiv(d, bd))](
        suffix, codes.contiguous(), dv, r, length, s, d, *value_units(dv.shape, dv.stride()),
        BT=bt, BD=bd, num_warps=warps, num_stages=stages,
    )  # fmt: skip
    return dv


@code_means_backward.register_fake
def _(
    grad_items: Tensor, codes: Tensor, counts: Tensor, first: int, dtype: torch.dtype, shape: Sequence[int],
    stride: Sequence[int],
) -> Tensor:  # fmt: skip
    return _values_gradient(
        grad_items, dtype, shape, stride
    )  # the real op's strides: torch.compile relies on them


def _values_gradient(like: Tensor, dtype: torch.dtype, shape: Sequence[int], stride: Sequence[int]) -> Tensor:
    """The values' gradient, empty: values of ``shape`` at ``stride`` take theirs in their dim order, where the kernels
    write it in place (:func:`~tvq_exp.attention.vq.fused.support.gradient_strides`)."""
    return like.new_empty_strided(shape, gradient_strides(shape, stride, shape[-1]), dtype=dtype)


def _setup_context(ctx, inputs: tuple, output: tuple[Tensor, Tensor, Tensor]) -> None:  # noqa: ANN001
    codes, values, _n0, _mu0, first, _items, _state = inputs
    counts, _item_means, state_means = output
    ctx.mark_non_differentiable(counts, state_means)
    ctx.save_for_backward(codes, counts)
    ctx.values_dtype, ctx.first = values.dtype, first
    ctx.values_shape, ctx.values_stride = list(values.shape), list(values.stride())


def _backward(ctx, _grad_counts: Tensor | None, grad_items: Tensor, _grad_state: Tensor | None) -> tuple:  # noqa: ANN001
    if grad_items is None:
        return (None,) * 7
    codes, counts = ctx.saved_tensors
    dv = code_means_backward(
        grad_items, codes, counts, ctx.first, ctx.values_dtype, ctx.values_shape, ctx.values_stride
    )
    return None, dv, None, None, None, None, None


code_means.register_autograd(_backward, setup_context=_setup_context)

__all__ = [
    "GPU_TILES",
    "code_means",
    "code_means_backward",
    "fused_cache_means",
    "kernel_tiles",
    "prefix_kernels",
    "value_units",
    "why_not",
]
