"""The test suite's Triton interpreter (``tests/helpers/interpreter.py``): a kernel that calls a ``@triton.jit`` helper
computes what stock Triton's interpreter computes, without the language patched again at each helper call, and
without the integer-overflow sanitiser."""

from __future__ import annotations

import importlib
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest
import torch
from triton.runtime import interpreter

from tests.helpers import interpreter as quick

KERNELS = """
import triton
import triton.language as tl


@triton.jit
def scaled(x, s):
    return x * s + tl.full(x.shape, 1.0, tl.float32)


@triton.jit
def twice_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, scaled(scaled(x, 2.0), 0.5), mask=mask)
"""


@pytest.fixture
def kernels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """A kernel module decorated under the interpreter (``TRITON_INTERPRET`` is read at decoration)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    (tmp_path / "interp_kernels.py").write_text(textwrap.dedent(KERNELS))
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("interp_kernels", None)
    return importlib.import_module("interp_kernels")


def launch(kernels: ModuleType, x: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    kernels.twice_kernel[(3,)](x, out, x.numel(), BLOCK=8)
    return out


def test_the_helper_calls_equal_stock_tritons_and_patch_the_language_once_a_launch(
    kernels: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    x = torch.randn(20)
    patches = []
    real = interpreter._patch_lang
    monkeypatch.setattr(interpreter, "_patch_lang", lambda fn: patches.append(fn.__name__) or real(fn))
    got = launch(kernels, x)
    # one patch for the launch: the 3 programs' 6 helper calls run in the launch's patched language
    assert patches == ["twice_kernel"]
    assert torch.equal(got, (x * 2 + 1) * 0.5 + 1)
    # stock Triton: the same values, and the language patched again at every helper call
    monkeypatch.setattr(interpreter.InterpretedFunction, "__call__", quick.STOCK_CALL)
    patches.clear()
    assert torch.equal(launch(kernels, x), got)
    assert patches == ["twice_kernel"] + ["scaled"] * 6
    # after the launch the language is Triton's own again (the launch restores it; no helper call left it patched)
    assert not quick._patched(kernels.scaled.fn)


def test_the_overflow_sanitiser_is_off_and_was_on_in_stock_triton() -> None:
    assert interpreter.interpreter_builder.options.sanitize_overflow is False
    assert interpreter.InterpreterOptions().sanitize_overflow is True
