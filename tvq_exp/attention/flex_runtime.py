"""What every flex-attention kernel here shares, whatever the backend: whether flex can run, the compiled-kernel
cache with its eager fallback past TorchDynamo's recompile limit, and the CPU-backward guard.

A backend's kernel is a plain function calling :func:`flex_attention` (dense's in :mod:`.dense.flex`,
Transformer-VQ's in :mod:`.vq.flex`); :func:`run_flex` runs it compiled or eager and :func:`wants_flex` is the
``kernel=plain|flex|auto`` choice of a backend that has one. These encode the torch-version limits of flex
attention, so a torch upgrade is checked in one file.
Over 300 lines: that one file is the point (support, compile cache, guards: each a limit of torch's flex).

Device notes (see :func:`flex_support`): on CPU the compiled kernel (inductor, needs a C++ compiler) is
forward-only: torch refuses ``requires_grad`` inputs on CPU, and inductor has no CPU backward. The eager
(uncompiled) implementation materialises the scores but has a correct math backward; :func:`run_flex` lifts
torch's CPU device check for that eager path only (:func:`eager_cpu_backward`). The compiled CPU kernel is also
wrong for query/key heads of 8 and 16 (:data:`FLEX_CPU_WRONG_KEY_DIMS`): such heads run eagerly, or plain under
``kernel=auto``. Kernels are compiled with ``dynamic=False``: automatic dynamic shapes (the recompile torch makes
on the second distinct length) produced a CPU kernel that fails with ``index out of bounds: 0 <= tmp36 < cur_qSplitSize`` when the ``score_mod``
indexes a captured table by the query index, so every new shape compiles once instead (a few seconds on CPU).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import os
import shutil
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from types import ModuleType

import torch
from torch import Tensor, nn

# torch >= 2.5. Found, not imported: importing it costs a large share of ``import tvq_exp.attention`` (it pulls in
# sympy), and a refused config must not pay for it. :func:`flex_module` imports it on first use of flex.
FLEX_AVAILABLE = importlib.util.find_spec("torch.nn.attention.flex_attention") is not None
_LAZY = ("BlockMask", "create_block_mask", "flex_attention")  # torch's names, re-exported on first access


def flex_module() -> ModuleType | None:
    """``torch.nn.attention.flex_attention``, imported on first call (None on a torch without it)."""
    if not FLEX_AVAILABLE:  # pragma: no cover - old torch
        return None
    return importlib.import_module("torch.nn.attention.flex_attention")


def __getattr__(name: str) -> object:
    """``BlockMask``, ``create_block_mask`` and ``flex_attention`` from torch, imported when first asked for (the
    kernel modules :mod:`.dense.flex` and :mod:`.vq.flex`, which the layers import only when flex runs)."""
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = flex_module()
    if module is None:  # pragma: no cover - old torch
        return object if name == "BlockMask" else None
    return getattr(module, name)


# ``kernel=auto`` takes flex only for calls with at least this many queries (flex's block size): below it block
# sparsity saves nothing, and every new length would compile anew (decoding token by token).
FLEX_MIN_QUERIES = 128
FLEX_DEVICES = ("cuda", "cpu", "xpu")
FLEX_CUDA_MIN_HEAD_DIM = 16  # torch's compiled CUDA kernel: "embedding dimension ... must be at least 16"
# torch 2.14.1's compiled CPU kernel gives wrong outputs, differing from call to call on the same inputs, where the
# queries' and keys' head dimension is 8 or 16, whatever the values' (a causal mask, 4 queries against 8 keys: most of
# its outputs wrong; every width from 1 to 40 and 48, 56, 64, 80, 96, 128 checked; the repro is
# tests/attention/test_flex_cpu_heads.py): such heads run flex eagerly on CPU.
FLEX_CPU_WRONG_KEY_DIMS = (8, 16)
# torch's compiled CUDA flex backward: for heads wider than this its default block sizes need more shared memory
# than an H100/H200 has ("No valid triton configs ... out of resource: triton_tem_fused_flex_attention_backward",
# pytorch/pytorch#133254), so such heads get backward blocks of FLEX_CUDA_WIDE_BACKWARD (the GAU's d_v is 2·d_model).
FLEX_CUDA_WIDE_HEAD_DIM = 128
FLEX_CUDA_WIDE_BACKWARD = {"BLOCK_M1": 32, "BLOCK_N1": 32, "BLOCK_M2": 32, "BLOCK_N2": 32}

KERNELS = ("plain", "flex", "auto")  # a backend's ``kernel`` option, where it has a flex kernel


class FlexUnsupported(RuntimeError):
    """Raised when flex attention cannot run the requested options; the message is the one-line reason."""


@dataclass(frozen=True)
class FlexSupport:
    """Whether flex attention can run (truthy) and, when not, the one-line ``reason``."""

    ok: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok


def flex_support(
    device: torch.device | str,
    *,
    requires_grad: bool = False,
    compiled: bool = True,
    head_dims: Sequence[int] = (),
) -> FlexSupport:
    """Can flex attention run on ``device`` (whatever the backend's options; a backend adds its own reasons)?

    Args:
        device: where ``q, k, v`` live.
        requires_grad: whether a backward pass is needed.
        compiled: the fused ``torch.compile`` kernel (True) or the eager, unfused implementation that
            materialises the ``Tq×Tk`` scores (False: a reference, slow).
        head_dims: the last dimensions of ``q, k, v`` where known (the compiled kernel needs each to be at least
            :data:`FLEX_CUDA_MIN_HEAD_DIM` on CUDA; on CPU the queries' and keys' must not be one of
            :data:`FLEX_CPU_WRONG_KEY_DIMS`).

    Returns a :class:`FlexSupport`; ``reason`` is empty when it can run.
    """
    device = torch.device(device)
    if not FLEX_AVAILABLE:
        return FlexSupport(
            False, f"torch {torch.__version__} has no torch.nn.attention.flex_attention (needs >= 2.5)"
        )
    if device.type not in FLEX_DEVICES:
        return FlexSupport(False, f"flex_attention runs on {'/'.join(FLEX_DEVICES)}, not {device.type}")
    # (compiling: dynamo runs, so it is supported; its check is a function dynamo will not trace, a graph break)
    if not torch.compiler.is_compiling() and not torch._dynamo.is_dynamo_supported():
        return FlexSupport(
            False, "flex_attention needs TorchDynamo, which this Python/platform does not support"
        )
    if not compiled:
        return FlexSupport(True)
    if device.type == "cuda" and head_dims and min(head_dims) < FLEX_CUDA_MIN_HEAD_DIM:
        return FlexSupport(
            False,
            f"compiled flex_attention on CUDA needs head dimensions of at least {FLEX_CUDA_MIN_HEAD_DIM} "
            f"(q, k, v: {', '.join(map(str, head_dims))}): use kernel=plain, or wider heads",
        )
    if device.type == "cpu" and head_dims and head_dims[0] in FLEX_CPU_WRONG_KEY_DIMS:
        return FlexSupport(
            False,
            f"compiled flex_attention on CPU gives wrong outputs for query/key heads of "
            f"{' or '.join(map(str, FLEX_CPU_WRONG_KEY_DIMS))} (torch {torch.__version__}; q, k, v: "
            f"{', '.join(map(str, head_dims))}): use kernel=plain, another d_k, or compiled=False (eager)",
        )
    if device.type == "cpu" and _cxx_compiler() is None:
        return FlexSupport(
            False,
            "flex_attention needs torch.compile with a C++ compiler (none found: install g++ or set CXX)",
        )
    if device.type == "cuda" and not _has_triton():
        return FlexSupport(False, "flex_attention on CUDA needs torch.compile with Triton (not installed)")
    if device.type == "cpu" and requires_grad:
        return FlexSupport(
            False,
            f"compiled flex_attention has no backward on CPU (torch {torch.__version__}): "
            "train on CUDA, or use compiled=False (eager, materialises the scores)",
        )
    return FlexSupport(True)


def flex_kernel_options(
    device: torch.device | str, head_dims: Sequence[int], backward: bool
) -> dict[str, int] | None:
    """The ``kernel_options`` a flex call on ``device`` with heads of ``head_dims`` (q, k, v) needs: the smaller
    backward blocks :data:`FLEX_CUDA_WIDE_BACKWARD` for a call with gradients (``backward``) on CUDA heads wider
    than :data:`FLEX_CUDA_WIDE_HEAD_DIM`, else None (torch's autotuned defaults; the forward fits with them)."""
    if backward and torch.device(device).type == "cuda" and max(head_dims) > FLEX_CUDA_WIDE_HEAD_DIM:
        return dict(FLEX_CUDA_WIDE_BACKWARD)
    return None


def _cxx_compiler() -> str | None:
    """The C++ compiler inductor would find: ``$CXX`` or one of its defaults on ``PATH`` (None if none)."""
    candidates = [os.environ.get("CXX", "")]
    try:
        cxx = torch._inductor.config.cpp.cxx
        candidates += [c for c in (cxx if isinstance(cxx, tuple) else (cxx,)) if c]
    except AttributeError:  # pragma: no cover - config layout changed
        pass
    candidates += ["g++", "c++", "clang++"]
    for name in candidates:
        if name and shutil.which(name):
            return shutil.which(name)
    return None


@functools.cache
def _has_triton() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


_COMPILED: dict[tuple[str, int | None, torch.dtype, Callable[..., Tensor]], Callable[..., Tensor]] = {}
_COMPILED_LOCK = threading.Lock()


def compiled_kernel(
    device: torch.device | str, dtype: torch.dtype, kernel: Callable[..., Tensor]
) -> Callable[..., Tensor]:
    """``kernel`` (a function that calls :func:`flex_attention`: dense's plain or XL one, Transformer-VQ's
    window + cache one) ``torch.compile``d for ``device``/``dtype``, made once and cached.
    ``dynamic=False``: each new shape compiles once (see the module doc); TorchDynamo's recompile limit
    (``torch._dynamo.config.recompile_limit``) bounds how many lengths one process can compile before it
    falls back to the eager implementation."""
    device = torch.device(device)
    key = (device.type, device.index, dtype, kernel)
    with _COMPILED_LOCK:
        if key not in _COMPILED:
            _COMPILED[key] = _eager_past_the_limit(
                torch.compile(kernel, dynamic=False, fullgraph=True), kernel
            )
        return _COMPILED[key]


def _eager_past_the_limit(
    compiled: Callable[..., Tensor], eager: Callable[..., Tensor]
) -> Callable[..., Tensor]:
    """``compiled``, or ``eager`` for the shapes that would compile once TorchDynamo's recompile limit is
    reached (``fullgraph=True`` turns that limit into an error; decoding token by token meets it)."""

    @functools.wraps(eager)
    def call(*args: object) -> Tensor:
        try:
            return compiled(*args)
        except torch._dynamo.exc.FailOnRecompileLimitHit:
            return eager(*args)

    return call


_GUARD_LOCK = threading.RLock()


@contextlib.contextmanager
def eager_cpu_backward() -> Iterator[None]:
    """Lift torch's ``FlexAttention does not support backward on CPU`` device check, for the eager
    (unfused) implementation only: its math backward is exact on CPU (checked against explicit logits,
    gradients of captured tensors included). A no-op if a future torch drops the check."""
    flex = flex_module()
    validate = getattr(flex, "_validate_device", None)
    if validate is None:
        yield
        return

    def validate_without_cpu_grad(query: Tensor, key: Tensor, value: Tensor) -> None:
        if query.device.type != "cpu":
            validate(query, key, value)

    with _GUARD_LOCK:
        flex._validate_device = validate_without_cpu_grad
        try:
            yield
        finally:
            flex._validate_device = validate


def kernel_options(q: Tensor, k: Tensor, v: Tensor) -> dict[str, int] | None:
    """:func:`flex_kernel_options` for a kernel's ``q, k, v`` (read inside the compiled kernel, where whether they
    need gradients is fixed for each compiled graph)."""
    backward = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    return flex_kernel_options(q.device, (q.shape[-1], k.shape[-1], v.shape[-1]), backward)


def run_flex(kernel: Callable[..., Tensor], args: tuple, compiled: bool | None = None) -> Tensor:
    """``kernel(*args)`` (a function calling :func:`flex_attention`, ``args[0]`` the queries), compiled
    (:func:`compiled_kernel`) or eager as ``compiled`` says (None: compiled unless it cannot run here, CPU with
    gradients or query/key heads of 8 or 16, or CUDA with heads narrower than 16, then eager). Raises
    :class:`FlexUnsupported` with the reason when flex cannot run."""
    q = args[0]
    needs_grad = torch.is_grad_enabled() and any(isinstance(a, Tensor) and a.requires_grad for a in args)
    dims = tuple(a.shape[-1] for a in args[:3])  # every kernel's first three arguments: q, k, v
    if compiled is None:
        compiled = flex_support(q.device, requires_grad=needs_grad, compiled=True, head_dims=dims).ok
    support = flex_support(q.device, requires_grad=needs_grad, compiled=compiled, head_dims=dims)
    if not support.ok:
        raise FlexUnsupported(support.reason)
    if not needs_grad:  # torch's CPU check looks at requires_grad, not at the grad mode
        args = tuple(a.detach() if isinstance(a, Tensor) else a for a in args)
    if compiled:
        return compiled_kernel(q.device, q.dtype, kernel)(*args)
    guard = eager_cpu_backward() if needs_grad and q.device.type == "cpu" else contextlib.nullcontext()
    with guard:
        return kernel(*args)


def wants_flex(kernel: str, module: nn.Module, q: Tensor, k: Tensor, v: Tensor, options: FlexSupport) -> bool:
    """A backend's ``kernel`` choice for one call of ``q (B, H, Tq, d)``: ``flex`` always, ``plain`` never,
    ``auto`` where the compiled kernel runs (``options``, the backend's own reasons, allow it; CUDA, or CPU
    without gradients) and the call has at least :data:`FLEX_MIN_QUERIES` queries (decoding steps stay plain)."""
    if kernel != "auto" or q.shape[2] < FLEX_MIN_QUERIES:
        return kernel == "flex"
    grad = torch.is_grad_enabled() and (
        any(t.requires_grad for t in (q, k, v)) or any(p.requires_grad for p in module.parameters())
    )
    dims = (q.shape[-1], k.shape[-1], v.shape[-1])
    # ``.ok``, not ``bool()``: torch 2.11's compile cannot call a frozen dataclass's ``__bool__`` (a graph break in each
    # compiled block on the H200 of 2026-11-30)
    return options.ok and flex_support(q.device, requires_grad=grad, compiled=True, head_dims=dims).ok


__all__ = [
    "FLEX_AVAILABLE",
    "FLEX_CPU_WRONG_KEY_DIMS",
    "FLEX_MIN_QUERIES",
    "KERNELS",
    "FlexSupport",
    "FlexUnsupported",
    "compiled_kernel",
    "eager_cpu_backward",
    "flex_kernel_options",
    "flex_module",
    "flex_support",
    "kernel_options",
    "run_flex",
    "wants_flex",
]
