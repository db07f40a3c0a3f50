"""Where the fused Triton kernels run, and their module loaded per mode.

CUDA, or CPU under Triton's interpreter (``TRITON_INTERPRET=1``, how kernels are debugged): :func:`unsupported` says
why not elsewhere (the layer's one-line refusal); :func:`wants_triton` is ``kernel=triton|auto``'s choice per call;
:func:`kernels` loads :mod:`.kernels` decorated for the interpreter or for the GPU.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import torch
from torch import Tensor

from tvq_exp.attention.flex_runtime import FLEX_MIN_QUERIES
from tvq_exp.attention.vq.fused.config import padded_dim, tiles
from tvq_exp.nn.triton_loader import has_triton, interpreted, load_kernels

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# whether Triton is installed, read once here as a constant torch.compile folds (:func:`unsupported` runs inside a
# compiled step: dynamo would trace has_triton()'s importlib)
TRITON = has_triton()
# the most forward value chunks kernel=auto gives the fused kernels (:func:`value_chunks`)
AUTO_MAX_CHUNKS = 2


def unsupported(device: torch.device | str | None, dtype: torch.dtype | None = None) -> str | None:
    """Why the Triton kernel cannot run on ``device`` (None: anywhere it may, CUDA or the interpreter) with
    ``dtype`` operands; None when it can."""
    if not TRITON:
        return "needs Triton, which is not installed"
    kind = None if device is None else torch.device(device).type
    if kind is None and not (torch.cuda.is_available() or interpreted()):
        return "runs on CUDA, or on CPU under Triton's interpreter (TRITON_INTERPRET=1); neither is here"
    if kind == "cpu" and not interpreted():
        return "runs on CPU only under Triton's interpreter (set TRITON_INTERPRET=1), else on CUDA"
    if kind not in (None, "cpu", "cuda"):
        return f"runs on CUDA (or CPU under TRITON_INTERPRET=1), not {kind}"
    if dtype is not None and dtype not in DTYPES:
        return f"takes fp32, bf16 or fp16 operands, not {dtype}"
    return None


@functools.cache
def kernels(interpret: bool) -> ModuleType:
    """The fused attention's kernel module (:mod:`.kernels`) for the interpreter or the GPU (:func:`load_kernels`),
    looked up once per mode (each op's launch asks for it: no path built per launch)."""
    return load_kernels(Path(__file__).with_name("kernels.py"), __package__, interpret)


def wants_triton(kernel: str, q: Tensor, d_v: int) -> bool:
    """A layer's ``kernel`` choice for one call of ``q (B, H, Tq, d_k)`` with values ``d_v`` wide: ``triton`` always
    (it raises where it cannot run); ``auto`` on CUDA for calls of at least
    :data:`~tvq_exp.attention.flex_runtime.FLEX_MIN_QUERIES` queries (decoding steps stay plain), with operands it
    takes, and values of at most :data:`AUTO_MAX_CHUNKS` forward chunks (:func:`value_chunks`); else never."""
    if kernel != "auto":
        return kernel == "triton"
    return (
        q.device.type == "cuda"
        and q.shape[2] >= FLEX_MIN_QUERIES
        and unsupported(q.device, q.dtype) is None
        and value_chunks(q.shape[-1], d_v, q.dtype) <= AUTO_MAX_CHUNKS
    )


def unit_strides(shape: Sequence[int], stride: Sequence[int]) -> tuple[int, ...] | None:
    """The strides of a tensor of rows ``(..., d)`` (``shape`` at ``stride``) over its leading dims in rows of ``d``
    (element strides over ``d``; 0 for a dim of one), where its rows are contiguous and each starts at a multiple of
    ``d``: how the kernels address every tensor of rows (the element at row offset ``u``, column ``c`` is ``u·d + c``);
    None where they cannot (a row not contiguous, or a stride not a multiple of ``d``: a slice of a wider last dim)."""
    width = shape[-1]
    if width > 1 and stride[-1] != 1:
        return None
    units = []
    for size, step in zip(shape[:-1], stride[:-1], strict=True):
        if size > 1 and step % width:
            return None
        units.append(step // width if size > 1 else 0)
    return tuple(units)


def block_units(shape: Sequence[int], stride: Sequence[int]) -> tuple[int, int, int] | None:
    """``(s_b, s_h, s_t)`` of blocks ``(B, H_kv, R, L, d)`` or ``(N, R, L, d)`` (``shape`` at ``stride``; ``s_h`` 0):
    the unit strides (:func:`unit_strides`) of their batch, key head and position, where the blocks are cut from one
    time axis (block ``r``'s positions follow block ``r - 1``'s: its stride is ``L·s_t``, ``s_t > 0``); None where
    not."""
    if len(shape) == 4:
        shape, stride = (shape[0], 1, *shape[1:]), (stride[0], 0, *stride[1:])
    units = unit_strides(shape, stride)
    if units is None:
        return None
    s_b, s_h, s_r, s_t = units
    blocks, length = shape[2], shape[3]
    if length > 1 and (s_t == 0 or (blocks > 1 and s_r != length * s_t)):
        return None
    return s_b, s_h, s_t if length > 1 else max(s_r, 1)


def dense_strides(shape: Sequence[int], stride: Sequence[int], width: int) -> tuple[int, ...]:
    """The strides of a dense tensor of rows shaped as ``shape`` but ``width`` wide, its leading dims in the order of
    ``stride`` (outermost first; a dim of one takes 0, equal strides keep their dims' order), its rows contiguous: so
    ``(B, T, H, d)`` memory seen as ``(B, H, T, d)`` gives the same layout, and a slice with gaps none."""
    dims = sorted((i for i in range(len(shape) - 1) if shape[i] > 1), key=lambda i: -stride[i])
    strides, step = [0] * (len(shape) - 1), width
    for i in reversed(dims):
        strides[i], step = step, step * shape[i]
    return (*strides, 1)


def extent(x: Tensor) -> int:
    """The elements from ``x``'s first to past its last (its numel where it is dense; 0 when empty): one past the
    largest offset the kernels read of it, which their int32 offsets must hold."""
    if not x.numel():
        return 0
    return 1 + sum((size - 1) * stride for size, stride in zip(x.shape, x.stride(), strict=True))


def gradient_strides(shape: Sequence[int], stride: Sequence[int], width: int) -> tuple[int, ...]:
    """The strides of the gradient (``width`` wide) of blocks ``(B, H_kv, R, L, d)`` or ``(N, R, L, d)`` (``shape`` at
    ``stride``), as the kernels write it: dense in the blocks' dim order (:func:`dense_strides`), or contiguous where
    that order is not one time axis's (:func:`block_units`: blocks copied from such a layout)."""
    dense = dense_strides(shape, stride, width)
    if block_units((*shape[:-1], width), dense) is not None:
        return dense
    return dense_strides(shape, range(len(shape), 0, -1), width)  # contiguous


def dense_units(x: Tensor) -> tuple[int, ...]:
    """:func:`unit_strides` of :func:`dense_like`'s layout of ``x``."""
    return dense_strides(x.shape, x.stride(), 1)[:-1]


def dense_like(x: Tensor, width: int, dtype: torch.dtype | None = None) -> Tensor:
    """An empty tensor shaped as ``x (..., d)`` but ``width`` wide, dense in ``x``'s dim order (:func:`dense_strides`),
    of ``x``'s device and dtype (or ``dtype``)."""
    return x.new_empty_strided(
        (*x.shape[:-1], width),
        dense_strides(x.shape, x.stride(), width),
        dtype=x.dtype if dtype is None else dtype,
    )


def value_chunks(d_k: int, d_v: int, dtype: torch.dtype) -> int:
    """How many chunks the fused forward splits values ``d_v`` wide into (128 columns each on the GPU:
    :func:`~tvq_exp.attention.vq.fused.config.tiles`); each chunk's program computes the scores again.

    ``kernel=auto`` takes the fused kernels up to :data:`AUTO_MAX_CHUNKS` (``d_v <= 256``: the scores computed at most
    twice per row). Wider values stay plain: at the GAU's ``d_v = 1536`` the fused forward computes each row's scores
    12 times (once per 128 columns) and the backward's key and code gradients as often, where the plain kernel
    computes them once and runs every product as a batched GEMM (docs/benchmarks.md, "Which kernel wide values
    take", counts the multiply-adds)."""
    return -(-padded_dim(d_v) // tiles("forward", d_k, d_v, fp32=dtype == torch.float32).bdv)


__all__ = [
    "AUTO_MAX_CHUNKS",
    "DTYPES",
    "block_units",
    "dense_like",
    "dense_strides",
    "dense_units",
    "extent",
    "gradient_strides",
    "kernels",
    "unit_strides",
    "unsupported",
    "value_chunks",
    "wants_triton",
]
