"""Where the fused Triton kernels run, and their module loaded per mode.

CUDA, or CPU under Triton's interpreter (``TRITON_INTERPRET=1``, how kernels are debugged): :func:`unsupported` says
why not elsewhere (the layer's one-line refusal); :func:`wants_triton` is ``kernel=triton|auto``'s choice per call;
:func:`kernels` loads :mod:`.kernels` decorated for the interpreter or for the GPU.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from pathlib import Path
from types import ModuleType

import torch
from torch import Tensor

from tvq_exp.attention.flex_runtime import FLEX_MIN_QUERIES

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def interpreted() -> bool:
    """Whether Triton's interpreter is asked for (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "yes", "on")


@functools.cache
def has_triton() -> bool:
    """Whether Triton can be imported."""
    return importlib.util.find_spec("triton") is not None


def unsupported(device: torch.device | str | None, dtype: torch.dtype | None = None) -> str | None:
    """Why the Triton kernel cannot run on ``device`` (None: anywhere it may, CUDA or the interpreter) with
    ``dtype`` operands; None when it can."""
    if not has_triton():
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
    """The kernel module decorated for the interpreter (``interpret``) or for the GPU: Triton reads
    ``TRITON_INTERPRET`` when it decorates, so each mode loads its own copy. Triton itself (its standard library's
    jit functions, which the kernels only name, never call) is imported in the compiled mode, so that both copies
    work in one process."""
    before = os.environ.get("TRITON_INTERPRET")
    try:
        os.environ["TRITON_INTERPRET"] = "0"
        importlib.import_module("triton")
        os.environ["TRITON_INTERPRET"] = "1" if interpret else "0"
        path = Path(__file__).with_name("kernels.py")
        name = f"{__package__}.kernels_{'interpreted' if interpret else 'compiled'}"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        if before is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = before
    return module


def wants_triton(kernel: str, q: Tensor) -> bool:
    """A layer's ``kernel`` choice for one call of ``q (B, H, Tq, d)``: ``triton`` always (it raises where it
    cannot run), ``auto`` on CUDA for calls of at least :data:`~tvq_exp.attention.flex_runtime.FLEX_MIN_QUERIES`
    queries (decoding steps stay plain) with operands it takes; else never."""
    if kernel != "auto":
        return kernel == "triton"
    return (
        q.device.type == "cuda" and q.shape[2] >= FLEX_MIN_QUERIES and unsupported(q.device, q.dtype) is None
    )


__all__ = ["DTYPES", "has_triton", "interpreted", "kernels", "unsupported", "wants_triton"]
