"""Triton's interpreter (``TRITON_INTERPRET=1``) for the test suite, without two costs that change nothing it computes
at the suite's sizes. Together they were over half of an interpreted kernel test's time (cProfile of
``test_the_ops_read_heads_interleaved_inputs_through_their_strides``, Triton 3.8: 22 s of kernels down to 10).

- **The language patched again at every device-function call.** A kernel's launch patches ``triton.language``'s
  builtins for the interpreter and restores them after the grid; each call of a ``@triton.jit`` helper inside it
  (``InterpretedFunction.__call__``) walks every member of the language's modules again (``inspect.getmembers``),
  once per helper call per program, and patches what is already patched. Here a helper called while its modules are
  patched runs at once; otherwise (never, inside a launch) Triton's own call patches first.
- **The integer-overflow sanitiser.** The interpreter checks every int32 add, subtract and multiply for overflow by
  redoing it in int64 with a device assert (compiled kernels do so only with ``debug=True``). The suite's tensors
  hold a few thousand elements: their offsets are nowhere near 2³¹. Turned off here.

Everything else the interpreter does (types, broadcasting, masks, every load and store) is unchanged; the kernel
tests compare against the plain and naive references as before."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import triton.language as tl
from triton.runtime import interpreter

STOCK_CALL = interpreter.InterpretedFunction.__call__  # Triton's own device-function call


def _patched(fn: Any) -> bool:
    """Whether the language modules ``fn`` sees (``triton.language``, its ``core``) are patched for the interpreter:
    a patched builtin is the interpreter's wrapper, which is not marked as a builtin."""
    langs = [v for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core)]
    return bool(langs) and all(not tl.core.is_builtin(lang.load) for lang in langs)


def quicken() -> None:
    """Install both changes in this process (the test session's ``pytest_configure``). A Triton without the parts
    they replace (written for 3.8; 3.6, the lent GPUs', has the same) keeps its interpreter as it is: slower, not
    different (``tests/test_interpreter.py`` then fails and says so)."""
    builder = getattr(interpreter, "interpreter_builder", None)
    options = getattr(builder, "options", None)
    if not (dataclasses.is_dataclass(options) and hasattr(options, "sanitize_overflow")):
        return

    def quick_call(self: interpreter.InterpretedFunction, *args: Any, **kwargs: Any) -> Any:
        if not _patched(self.fn):
            return STOCK_CALL(self, *args, **kwargs)
        fn = self.rewrite()
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise interpreter.InterpreterError(repr(e)) from e

    interpreter.InterpretedFunction.__call__ = quick_call  # type: ignore[method-assign]
    builder.options = dataclasses.replace(builder.options, sanitize_overflow=False)
