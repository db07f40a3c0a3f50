"""Dense attention through :func:`torch.nn.attention.flex_attention`: block masks, the windowed
Transformer-XL bias as a ``score_mod``, a compiled-kernel cache and a clear fallback.

Over 300 lines: the support check, the masks, the ``score_mod``, the kernel cache and the CPU-backward
guard all encode the same torch-version limits of flex attention (below), so a torch upgrade is checked
in one file; a quarter of its lines are docstrings.

What flex can express for :class:`~tvq_exp.attention.dense.DenseAttention` (torch 2.14, checked on CPU):

- plain softmax, causal or not, with queries that start ``past`` positions after the keys and an
  optional sliding window: a :class:`BlockMask` (:func:`block_mask`);
- the XL bias ``(q_i + v)·r_{i-j}`` for ``0 <= i-j <= M`` (encoders: ``|i-j| <= M``): it depends on
  the query vector, so it is precomputed as a distance-logit table ``P = (q + v)·rᵀ`` of shape
  ``(B, H, Tq, M + 1)`` (encoders ``2M + 1``) and gathered inside the ``score_mod``
  (:func:`xl_score_mod`); gradients reach ``P`` (a captured tensor), hence ``u``, ``v`` and ``W_r``;
- ``d_v != d_k`` is fine.

What it cannot: ReLU² scores (flex always normalises ``exp(score)`` over the keys) and talking heads
(a ``score_mod`` sees one head's score at a time). :func:`flex_support` says so, with a one-line reason.

Device notes (see ``flex_support``): on CPU the compiled kernel (inductor, needs a C++ compiler) is
forward-only: torch refuses ``requires_grad`` inputs on CPU, and inductor has no CPU backward. The
eager (uncompiled) implementation materialises the ``Tq×Tk`` scores but has a correct math backward;
:func:`flex_dense_attention` lifts torch's CPU device check for that eager path only (reference use,
tests). Kernels are compiled with ``dynamic=False``: automatic dynamic shapes (the recompile torch
makes on the second distinct length) produced a CPU kernel that fails with
``index out of bounds: 0 <= tmp36 < cur_qSplitSize`` when the ``score_mod`` indexes a captured table
by the query index, so every new ``(Tq, Tk, past)`` compiles once instead (a few seconds on CPU).

Shapes: ``q (B, H, Tq, d_k)``, ``k (B, H, Tk, d_k)``, ``v (B, H, Tk, d_v)`` -> ``(B, H, Tq, d_v)``;
query ``i`` sits at position ``past + i``, key ``j`` at ``j``. No scaling of ``q·kᵀ`` (``scale=1``),
as every backend here (:mod:`tvq_exp.attention.base`).
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

try:  # torch >= 2.5
    import torch.nn.attention.flex_attention as _flex_module
    from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention
except ImportError:  # pragma: no cover - old torch
    _flex_module = None
    BlockMask = object  # type: ignore[assignment,misc]
    create_block_mask = flex_attention = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from tvq_exp.attention.dense import DenseAttention

FLEX_AVAILABLE = _flex_module is not None
# ``kernel=auto`` takes flex only for calls with at least this many queries (flex's block size): below it block
# sparsity saves nothing, and every new length would compile anew (decoding token by token).
FLEX_MIN_QUERIES = 128
FLEX_DEVICES = ("cuda", "cpu", "xpu")

ScoreMod = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]
MaskMod = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]


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
    score: str = "softmax",
    talking_heads: bool = False,
    requires_grad: bool = False,
    compiled: bool = True,
) -> FlexSupport:
    """Can dense attention with these options run through flex attention on ``device``?

    Args:
        device: where ``q, k, v`` live.
        score: ``softmax`` or ``relu2`` (DenseAttention's ``score``).
        talking_heads: whether logits (or weights) are mixed across heads.
        requires_grad: whether a backward pass is needed.
        compiled: the fused ``torch.compile`` kernel (True) or the eager, unfused implementation that
            materialises the ``Tq×Tk`` scores (False: a reference, slow).

    Returns a :class:`FlexSupport`; ``reason`` is empty when it can run.
    """
    device = torch.device(device)
    if not FLEX_AVAILABLE:
        return FlexSupport(
            False, f"torch {torch.__version__} has no torch.nn.attention.flex_attention (needs >= 2.5)"
        )
    if score != "softmax":
        return FlexSupport(
            False,
            f"{score} scores are not softmax: flex_attention always normalises exp(score) over the keys",
        )
    if talking_heads:
        return FlexSupport(
            False, "talking heads mix logits across heads: a flex score_mod sees one head's score at a time"
        )
    if device.type not in FLEX_DEVICES:
        return FlexSupport(False, f"flex_attention runs on {'/'.join(FLEX_DEVICES)}, not {device.type}")
    if not torch._dynamo.is_dynamo_supported():
        return FlexSupport(
            False, "flex_attention needs TorchDynamo, which this Python/platform does not support"
        )
    if not compiled:
        return FlexSupport(True)
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
    no window). Cached per arguments: building one for ``T = 8192`` takes ~0.3 s on CPU."""
    if not causal and window is None:
        return None
    return _block_mask(t_q, t_k, str(torch.device(device)), past, causal, window)


@functools.lru_cache(maxsize=64)
def _block_mask(t_q: int, t_k: int, device: str, past: int, causal: bool, window: int | None) -> BlockMask:
    return create_block_mask(causal_mask_mod(past, causal, window), None, None, t_q, t_k, device=device)


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
    return flex_attention(q, k, v, block_mask=mask, scale=1.0)


def _xl_kernel(
    q: Tensor, k: Tensor, v: Tensor, mask: BlockMask | None, table: Tensor, past: int, causal: bool
) -> Tensor:
    # the score_mod is built inside the compiled function, so a new table never triggers a recompile
    return flex_attention(q, k, v, score_mod=xl_score_mod(table, past, causal), block_mask=mask, scale=1.0)


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
    validate = getattr(_flex_module, "_validate_device", None)
    if validate is None:
        yield
        return

    def validate_without_cpu_grad(query: Tensor, key: Tensor, value: Tensor) -> None:
        if query.device.type != "cpu":
            validate(query, key, value)

    with _GUARD_LOCK:
        _flex_module._validate_device = validate_without_cpu_grad
        try:
            yield
        finally:
            _flex_module._validate_device = validate


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


def run_flex(kernel: Callable[..., Tensor], args: tuple, compiled: bool | None = None) -> Tensor:
    """``kernel(*args)`` (a function calling :func:`flex_attention`, ``args[0]`` the queries), compiled
    (:func:`compiled_kernel`) or eager as ``compiled`` says (None: compiled unless it cannot run here, CPU with
    gradients, then eager). Raises :class:`FlexUnsupported` with the reason when flex cannot run."""
    q = args[0]
    needs_grad = torch.is_grad_enabled() and any(isinstance(a, Tensor) and a.requires_grad for a in args)
    if compiled is None:
        compiled = bool(flex_support(q.device, requires_grad=needs_grad, compiled=True))
    support = flex_support(q.device, requires_grad=needs_grad, compiled=compiled)
    if not support:
        raise FlexUnsupported(support.reason)
    if not needs_grad:  # torch's CPU check looks at requires_grad, not at the grad mode
        args = tuple(a.detach() if isinstance(a, Tensor) else a for a in args)
    if compiled:
        return compiled_kernel(q.device, q.dtype, kernel)(*args)
    guard = eager_cpu_backward() if needs_grad and q.device.type == "cpu" else contextlib.nullcontext()
    with guard:
        return kernel(*args)


def dense_support(
    module: DenseAttention, device: torch.device | str, requires_grad: bool = False, compiled: bool = True
) -> FlexSupport:
    """:func:`flex_support` for a :class:`~tvq_exp.attention.dense.DenseAttention`'s own options."""
    talking = module.mix_pre is not None or module.mix_post is not None
    return flex_support(
        device, score=module.score, talking_heads=talking, requires_grad=requires_grad, compiled=compiled
    )


def dense_attention_flex(
    module: DenseAttention, q: Tensor, k: Tensor, v: Tensor, past: int = 0, compiled: bool | None = None
) -> Tensor:
    """What ``module._attend(q, k, v, past)`` computes (the attention of a
    :class:`~tvq_exp.attention.dense.DenseAttention`, XL bias included), through flex attention.

    ``q (B, H, Tq, d_k)``, ``k (B, H, Tk, d_k)``, ``v (B, H, Tk, d_v)`` with ``Tk = past + Tq`` (keys
    and values already repeated to every query head) -> ``(B, H, Tq, d_v)``. The content query is
    ``q + u``; the distance logits ``(q + v)·r_d`` are made here, once per call, and gathered by the
    ``score_mod``; the module's ``attention_window`` (if it has one) becomes the mask's window. Raises :class:`FlexUnsupported` for ReLU² scores and talking heads.
    """
    talking = module.mix_pre is not None or module.mix_post is not None
    if module.score != "softmax" or talking:
        raise FlexUnsupported(flex_support(q.device, score=module.score, talking_heads=talking).reason)
    window = getattr(
        module, "attention_window", None
    )  # sliding-window dense baseline, where the module has it
    if module.bias is None:
        return flex_dense_attention(
            q, k, v, causal=module.causal, past=past, window=window, compiled=compiled
        )
    bias = module.bias
    rel = module._relative_embeddings().to(q.dtype)  # (H, M+1 | 2M+1, d_k), once per call (as the plain path)
    table = torch.matmul(bias.position_query(q), rel.transpose(-1, -2).unsqueeze(0))  # (B, H, Tq, M+1 | 2M+1)
    return flex_dense_attention(
        bias.content_query(q),
        k,
        v,
        causal=module.causal,
        past=past,
        window=window,
        distance_logits=table,
        compiled=compiled,
    )


__all__ = [
    "FLEX_AVAILABLE",
    "FLEX_MIN_QUERIES",
    "FlexSupport",
    "FlexUnsupported",
    "block_mask",
    "causal_mask_mod",
    "compiled_kernel",
    "dense_attention_flex",
    "dense_support",
    "eager_cpu_backward",
    "flex_dense_attention",
    "flex_support",
    "run_flex",
    "xl_score_mod",
]
