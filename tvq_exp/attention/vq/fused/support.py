"""Where the fused Triton kernels run, and their module loaded per mode.

CUDA, or CPU under Triton's interpreter (``TRITON_INTERPRET=1``, how kernels are debugged): :func:`unsupported` says
why not elsewhere (the layer's one-line refusal); :func:`wants_triton` is ``kernel=triton|auto``'s choice per call;
:func:`kernels` loads :mod:`.kernels` decorated for the interpreter or for the GPU.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import torch
from torch import Tensor

from tvq_exp.attention.flex_runtime import FLEX_MIN_QUERIES
from tvq_exp.nn.triton_loader import has_triton, interpreted, load_kernels

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# whether Triton is installed, read once here as a constant torch.compile folds (:func:`unsupported` runs inside a
# compiled step: dynamo would trace has_triton()'s importlib)
TRITON = has_triton()


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


def kernels(interpret: bool) -> ModuleType:
    """The fused attention's kernel module (:mod:`.kernels`) for the interpreter or the GPU (:func:`load_kernels`)."""
    return load_kernels(Path(__file__).with_name("kernels.py"), __package__, interpret)


def wants_triton(kernel: str, q: Tensor) -> bool:
    """A layer's ``kernel`` choice for one call of ``q (B, H, Tq, d)``: ``triton`` always (it raises where it
    cannot run), ``auto`` on CUDA for calls of at least :data:`~tvq_exp.attention.flex_runtime.FLEX_MIN_QUERIES`
    queries (decoding steps stay plain) with operands it takes; else never."""
    if kernel != "auto":
        return kernel == "triton"
    return (
        q.device.type == "cuda" and q.shape[2] >= FLEX_MIN_QUERIES and unsupported(q.device, q.dtype) is None
    )


__all__ = ["DTYPES", "kernels", "unsupported", "wants_triton"]
