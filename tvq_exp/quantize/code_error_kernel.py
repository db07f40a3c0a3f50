"""The Triton kernels of the quantiser's per-key work (see :mod:`.code_error`): loaded by
:func:`tvq_exp.nn.triton_loader.load_kernels` once per mode (compiled, or interpreted on the CPU), never imported
directly.

Each program takes ``BM`` keys of one head, reads them once in their dtype, gathers their codes' rows from the
codebook (``S`` rows: in L2) and works in fp32: the squared error and the squared norm per key and the code's row in
the keys' dtype (:func:`code_error_kernel`), the commitment loss's gradient (:func:`code_error_backward_kernel`), or
the keys added into their codes' sums (:func:`code_sums_kernel`).
"""

from __future__ import annotations

import triton
import triton.language as tl


# Only Triton's builtins and this module's functions are called (the standard library's jit functions, ``tl.sum``
# among them, take the mode Triton was first imported in): the row sum names the standard combine function, which
# the interpreter recognises without calling it and the compiler inlines.
@triton.jit
def _row_sum(x):
    return tl.reduce(x, 1, tl.standard._sum_combine)


@triton.jit
def _rows(pid, N, D, BM: tl.constexpr, DK: tl.constexpr):
    """The program's key rows (int64), their mask, the dims and the ``(BM, DK)`` mask."""
    rows = (pid * BM + tl.arange(0, BM)).to(tl.int64)
    dims = tl.arange(0, DK)
    row_ok = rows < N
    return rows, row_ok, dims, row_ok[:, None] & (dims[None, :] < D)


@triton.jit
def code_error_kernel(
    x_ptr, c_ptr, cv_ptr, codes_ptr, err_ptr, sq_ptr, value_ptr,
    N, S, D, stride_xh, stride_xn,
    BM: tl.constexpr, DK: tl.constexpr,
):  # fmt: skip
    """Keys ``x (H, N, D)`` (strides ``stride_xh``, ``stride_xn``; the last dimension contiguous), the codebook ``c
    (H, S, D)`` fp32 and as the keys' dtype ``cv``, ``codes (H, N)`` int64: ``err (H, N) = ||x - c[code]||²`` and
    ``sq (H, N) = ||x||²`` (fp32), ``value (H, N, D) = cv[code]``."""
    h = tl.program_id(1).to(tl.int64)
    rows, row_ok, dims, ok = _rows(tl.program_id(0), N, D, BM, DK)
    x = tl.load(x_ptr + h * stride_xh + rows[:, None] * stride_xn + dims[None, :], mask=ok, other=0.0)
    x = x.to(tl.float32)
    code = tl.load(codes_ptr + h * N + rows, mask=row_ok, other=0)
    at = (h * S + code)[:, None] * D + dims[None, :]
    diff = x - tl.load(c_ptr + at, mask=ok, other=0.0)
    tl.store(err_ptr + h * N + rows, _row_sum(diff * diff), mask=row_ok)
    tl.store(sq_ptr + h * N + rows, _row_sum(x * x), mask=row_ok)
    tl.store(value_ptr + (h * N + rows)[:, None] * D + dims[None, :], tl.load(cv_ptr + at, mask=ok), mask=ok)


@triton.jit
def code_error_backward_kernel(
    x_ptr, c_ptr, codes_ptr, grad_ptr, dx_ptr,
    N, S, D, stride_xh, stride_xn,
    BM: tl.constexpr, DK: tl.constexpr,
):  # fmt: skip
    """The gradient of ``err`` (:func:`code_error_kernel`) to the keys: ``dx (H, N, D) = 2·grad[h, n]·(x -
    c[code])``, in ``dx``'s dtype (contiguous), from ``grad (H, N)`` fp32."""
    h = tl.program_id(1).to(tl.int64)
    rows, row_ok, dims, ok = _rows(tl.program_id(0), N, D, BM, DK)
    x = tl.load(x_ptr + h * stride_xh + rows[:, None] * stride_xn + dims[None, :], mask=ok, other=0.0)
    code = tl.load(codes_ptr + h * N + rows, mask=row_ok, other=0)
    c = tl.load(c_ptr + (h * S + code)[:, None] * D + dims[None, :], mask=ok, other=0.0)
    g = 2.0 * tl.load(grad_ptr + h * N + rows, mask=row_ok, other=0.0)
    dx = g[:, None] * (x.to(tl.float32) - c)
    tl.store(dx_ptr + (h * N + rows)[:, None] * D + dims[None, :], dx.to(dx_ptr.dtype.element_ty), mask=ok)


@triton.jit
def code_sums_kernel(
    x_ptr, codes_ptr, sums_ptr,
    N, S, D, stride_xh, stride_xn,
    BM: tl.constexpr, DK: tl.constexpr,
):  # fmt: skip
    """Keys ``x (H, N, D)`` added in fp32 into their codes' rows of ``sums (H, S, D)`` (atomic adds: the order of
    the additions, and so the last bits, may differ between runs on a GPU)."""
    h = tl.program_id(1).to(tl.int64)
    rows, row_ok, dims, ok = _rows(tl.program_id(0), N, D, BM, DK)
    x = tl.load(x_ptr + h * stride_xh + rows[:, None] * stride_xn + dims[None, :], mask=ok, other=0.0)
    code = tl.load(codes_ptr + h * N + rows, mask=row_ok, other=0)
    tl.atomic_add(sums_ptr + (h * S + code)[:, None] * D + dims[None, :], x.to(tl.float32), mask=ok)
