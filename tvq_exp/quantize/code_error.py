"""The quantiser's per-key work in Triton kernels (:mod:`.code_error_kernel`): the commitment loss's squared errors,
the keys' squared norms, the codes' rows the attention reads, and the EMA statistics' sums, each key read once in
its dtype.

The plain path (:meth:`tvq_exp.quantize.VectorQuantizer.forward` without them, their reference; the tests hold the
two equal) casts the keys to an fp32 copy, gathers the codes' fp32 rows and, apart, their rows in the keys' dtype
(``torch.gather`` with an index as large as the keys), takes the mean squared error of the two fp32 tensors, its
norm, and a ``scatter_add_`` of the fp32 keys; the backward writes the error's gradient in fp32 and casts it. On
one H200 (2026-11-30, ``make bench-gpu``, VQ's fused layer at 32k, 512k bf16 keys of dim 128) those were about 1.1
of the layer's 8.1 ms of device time.

- :func:`code_error` (``tvq::code_error``): ``err = ||x - c||²`` and ``sq = ||x||²`` per key (fp32), the code's row
  in ``x``'s dtype; ``err`` is differentiable in ``x`` (``tvq::code_error_backward``: ``2·∂err·(x - c)`` in ``x``'s
  dtype, from ``x`` again: no fp32 copy of the keys is kept), ``sq`` and the row are not.
- :func:`add_code_sums` (``tvq::code_sums_``): the keys added in fp32 into their codes' rows of a sums buffer, with
  atomic adds (as ``scatter_add_`` on CUDA); under ``torch.use_deterministic_algorithms`` the plain
  ``scatter_add_`` instead.

The ops run on CUDA, and on the CPU under Triton's interpreter (the tests; the quantiser takes them where the fused
search runs: :func:`tvq_exp.quantize.kmeans.fused_search`). ``torch.compile`` keeps them whole in its graphs.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from tvq_exp.nn.triton_loader import cdiv, load_kernels, padded_dim

BM, WARPS = 64, 4  # keys per program; each program's tile is BM x padded d


def _launch(name: str, x: Tensor, codes: int, *args: Tensor) -> None:
    """Run kernel ``name`` over ``x (H, N, d)``'s keys (``x``'s last dimension contiguous) with a codebook of
    ``codes`` rows and the kernel's other tensors ``args``."""
    h, n, d = x.shape
    if n == 0 or h == 0:
        return
    kernels = load_kernels(Path(__file__).with_name("code_error_kernel.py"), __package__, x.device.type == "cpu")
    getattr(kernels, name)[(cdiv(n, BM), h)](
        x, *args, n, codes, d, x.stride(0), x.stride(1), BM=BM, DK=padded_dim(d), num_warps=WARPS
    )


def _rows_last(x: Tensor) -> Tensor:
    """``x`` with its last dimension contiguous (a copy only where it is not)."""
    return x if x.stride(-1) == 1 else x.contiguous()


@torch.library.custom_op("tvq::code_error", mutates_args=())
def code_error(x: Tensor, codebook: Tensor, codes: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Keys ``x (H, N, d)`` (any strides), ``codebook (H, S, d)``, ``codes (H, N)`` int64 -> ``err (H, N)``
    ``= ||x - codebook[code]||²`` and ``sq (H, N) = ||x||²`` (fp32: ``x`` and the fp32 codebook), and ``value (H,
    N, d) = codebook[code]`` in ``x``'s dtype (the codebook cast, then gathered). Differentiable in ``x`` through
    ``err`` only."""
    x = _rows_last(x)
    c = codebook.detach().float().contiguous()
    cv = codebook.detach().to(x.dtype).contiguous()
    h, n, d = x.shape
    err = x.new_empty(h, n, dtype=torch.float32)
    sq = torch.empty_like(err)
    value = x.new_empty(h, n, d)
    _launch("code_error_kernel", x, c.shape[1], c, cv, codes.contiguous(), err, sq, value)
    return err, sq, value


@code_error.register_fake
def _(x: Tensor, codebook: Tensor, codes: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    h, n, d = x.shape
    err = x.new_empty(h, n, dtype=torch.float32)
    return err, torch.empty_like(err), x.new_empty(h, n, d)


@torch.library.custom_op("tvq::code_error_backward", mutates_args=())
def code_error_backward(x: Tensor, codebook: Tensor, codes: Tensor, grad: Tensor) -> Tensor:
    """The gradient of :func:`code_error`'s ``err`` to ``x``: ``2·grad[h, n]·(x - codebook[code])`` ``(H, N, d)``
    in ``x``'s dtype (contiguous), from ``grad (H, N)``."""
    x = _rows_last(x)
    dx = x.new_empty(x.shape)
    c = codebook.detach().float().contiguous()
    _launch("code_error_backward_kernel", x, c.shape[1], c, codes.contiguous(), grad.float().contiguous(), dx)
    return dx


@code_error_backward.register_fake
def _(x: Tensor, codebook: Tensor, codes: Tensor, grad: Tensor) -> Tensor:
    return x.new_empty(x.shape)


def _setup(ctx: torch.autograd.function.FunctionCtx, inputs: tuple[Tensor, ...], output: tuple[Tensor, ...]) -> None:
    x, codebook, codes = inputs
    ctx.save_for_backward(x, codebook, codes)


def _backward(
    ctx: torch.autograd.function.FunctionCtx, grad_err: Tensor | None, grad_sq: Tensor | None, grad_value: Tensor | None
) -> tuple[Tensor | None, None, None]:
    x, codebook, codes = ctx.saved_tensors
    if grad_err is None:
        return None, None, None
    return code_error_backward(x, codebook, codes, grad_err), None, None


code_error.register_autograd(_backward, setup_context=_setup)


@torch.library.custom_op("tvq::code_sums_", mutates_args=("sums",))
def add_code_sums(x: Tensor, codes: Tensor, sums: Tensor) -> None:
    """Add keys ``x (H, N, d)`` (any strides) in fp32 into their codes' rows of ``sums (H, S, d)`` fp32 (``codes (H,
    N)`` int64), in place: atomic adds, or ``scatter_add_`` where deterministic algorithms are asked for."""
    if torch.are_deterministic_algorithms_enabled():
        h, n, d = x.shape
        sums.scatter_add_(1, codes[..., None].expand(h, n, d), x.to(sums.dtype))
        return
    if not sums.is_contiguous() or sums.dtype != torch.float32:
        raise ValueError(f"sums must be a contiguous fp32 tensor, got {sums.dtype} with strides {sums.stride()}")
    _launch("code_sums_kernel", _rows_last(x), sums.shape[1], codes.contiguous(), sums)


__all__ = ["add_code_sums", "code_error", "code_error_backward"]
