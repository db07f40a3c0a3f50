"""Triton kernel modules loaded per mode: compiled for the GPU, or run by Triton's interpreter on the CPU
(``TRITON_INTERPRET=1``, how kernels are debugged and how the tests run them without a GPU); and the launch
arithmetic every kernel here shares (grid sizes, padded tile widths)."""

from __future__ import annotations

import functools
import importlib.util
import os
from pathlib import Path
from types import ModuleType


def interpreted() -> bool:
    """Whether Triton's interpreter is asked for (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "yes", "on")


@functools.cache
def has_triton() -> bool:
    """Whether Triton can be imported."""
    return importlib.util.find_spec("triton") is not None


@functools.cache
def load_kernels(path: Path, package: str, interpret: bool) -> ModuleType:
    """The Triton kernel module at ``path`` (of ``package``) decorated for the interpreter (``interpret``) or for
    the GPU: Triton reads ``TRITON_INTERPRET`` when it decorates, so each mode loads its own copy. Triton itself
    (its standard library's jit functions, which the kernels only name, never call) is imported in the compiled
    mode, so that both copies work in one process."""
    before = os.environ.get("TRITON_INTERPRET")
    try:
        os.environ["TRITON_INTERPRET"] = "0"
        importlib.import_module("triton")
        os.environ["TRITON_INTERPRET"] = "1" if interpret else "0"
        name = f"{package}.{path.stem}_{'interpreted' if interpret else 'compiled'}"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        if before is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = before
    return module


MIN_TILE = 16  # tl.dot needs every dimension >= 16


def padded_dim(d: int) -> int:
    """A head dimension as the kernels tile it: the next power of two, at least :data:`MIN_TILE`."""
    return max(MIN_TILE, 1 << (d - 1).bit_length())


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)``: programs of ``b`` covering ``a``."""
    return -(-a // b)


__all__ = ["MIN_TILE", "cdiv", "has_triton", "interpreted", "load_kernels", "padded_dim"]
