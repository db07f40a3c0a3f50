"""The quantiser's pass over its keys in one Triton kernel: :func:`code_statistics`, and :func:`plain_statistics`, its
reference in torch's ops (the tests hold the two equal).

Once the codes are found, a training forward of the quantiser needs of each key and its code: the code's row in the
keys' dtype and layout (what the attention reads), the squared error ``||k - C_z||²`` (the commitment loss, with its
gradient to the key), the key's squared norm (the relative error's denominator), the code's count and, for the EMA
rule, the key added to its code's sum. By torch's ops that is about fifteen launches over key-sized tensors: an fp32
copy of the keys, an fp32 gather of the codes, the losses' passes, a gather in the keys' layout, two scatters. On
the H200 of 2026-11-30 they took about 1.2 of the 7.1 device ms of VQ's eager attention layer at 32k (forward and
backward, 512k keys of 128, ``S = 512``), 0.55 ms more than the 128k target allowed. Here one kernel reads each key
once and writes its code's row; the gradient of the squared error is one more (:data:`error_grad_kernel`) in the
backward.

Runs eagerly on CUDA (the quantiser takes it where the search is fused, and not while compiling: there inductor fuses
the plain ops) or on CPU under Triton's interpreter (the tests).
"""

from __future__ import annotations

import functools
from pathlib import Path
from types import ModuleType
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from tvq_exp.nn.triton_loader import cdiv, load_kernels, padded_dim
from tvq_exp.quantize.health import DEAD_SHARE, code_counts, dead_fraction, usage_perplexity

# keys per program: on a GPU 32 on 4 warps (make kernel-report: at 128-wide keys 32 fp32 values of each of the key and
# its code a thread, no spills; 64 rows spilled fp32 keys), under the interpreter 16 (its cost grows with the tile)
ROWS = {False: 32, True: 16}
METRICS_CODES = 1024  # codes a step of the metrics' one program


class CodeStatistics(NamedTuple):
    """What the quantiser takes from keys ``k (B, H, T, d)`` and their codes ``z (H, N = B·T)``:

    - ``rows``: ``C[z]`` in ``k``'s dtype, ``(B, H, T, d)``: in ``k``'s layout where fused, where several heads lie
      inner or contiguous by torch's ops (:func:`_attended_codes`); no gradient;
    - ``sq_error``: ``Σ ||k - C_z||²`` over every key, 0-d fp32, its gradient reaching ``k`` (``C`` held constant);
    - ``sq_norm``: ``Σ ||k||²``, 0-d fp32 (no gradient);
    - ``counts``: the keys each code took, ``(H, S)`` fp32;
    - ``sums``: the keys' sum per code, ``(H, S, d)`` fp32 (fp32 values of the keys), or None where not asked for."""

    rows: Tensor
    sq_error: Tensor
    sq_norm: Tensor
    counts: Tensor
    sums: Tensor | None


def plain_statistics(
    k: Tensor,
    codes: Tensor,
    codebook: Tensor,
    sums: bool,
    kf: Tensor | None = None,
    quant: Tensor | None = None,
) -> CodeStatistics:
    """:func:`code_statistics` by torch's ops (its reference): ``k (B, H, T, d)``, ``codes (H, N)``, ``codebook (H,
    S, d)`` (held constant); ``kf`` (the keys ``(H, N, d)`` fp32, with their gradient) and ``quant`` (``C_z (H, N,
    d)``) where the caller has them."""
    b, h, t, d = k.shape
    kf = k.transpose(0, 1).reshape(h, b * t, d).float() if kf is None else kf
    if quant is None:
        quant = torch.gather(codebook.float(), 1, codes[..., None].expand(h, b * t, d))
    flat = kf.detach()
    return CodeStatistics(
        rows=_attended_codes(codebook, codes, k, quant),
        sq_error=F.mse_loss(kf, quant.detach().float(), reduction="sum"),
        sq_norm=torch.linalg.vector_norm(flat).square(),  # one read, no squared copy
        counts=code_counts(codes, codebook.shape[1]),
        sums=key_sums(flat, codes, codebook.shape[1]) if sums else None,
    )


class CodeMetrics(NamedTuple):
    """The quantiser's metrics of one forward (0-d fp32 tensors, no gradient): ``perplexity``, the heads' mean usage
    perplexity (:func:`~tvq_exp.quantize.health.usage_perplexity`); ``quant_error``, ``Σ||k - C_z||² / Σ||k||²``;
    ``dead_codes``, the heads' mean count of dead codes (:func:`~tvq_exp.quantize.health.dead_fraction` times S)."""

    perplexity: Tensor
    quant_error: Tensor
    dead_codes: Tensor


def plain_metrics(stats: CodeStatistics, numel: int) -> CodeMetrics:
    """:class:`CodeMetrics` of ``stats`` over ``numel`` key values, by torch's ops (:func:`fused_metrics`'
    reference)."""
    counts = stats.counts
    return CodeMetrics(
        usage_perplexity(counts).mean().detach(),
        (stats.sq_error / stats.sq_norm.clamp_min(1e-12 * numel)).detach(),
        (dead_fraction(counts).mean() * counts.shape[-1]).detach(),
    )


def fused_metrics(stats: CodeStatistics, numel: int) -> CodeMetrics:
    """:func:`plain_metrics` in one launch (:data:`metrics_kernel`, one program): by torch's ops they are some twenty
    launches of a few numbers each, per quantiser and forward, which an eager step on a GPU waits on its host for."""
    out = torch.empty(3, device=stats.counts.device)
    h, s = stats.counts.shape
    statistics_kernels(stats.counts.device.type == "cpu").metrics_kernel[(1,)](
        stats.counts.float().contiguous(), stats.sq_error.detach(), stats.sq_norm, out, h, s, numel, DEAD_SHARE,
        BS=min(METRICS_CODES, padded_dim(s)), num_warps=4,
    )  # fmt: skip
    return CodeMetrics(out[0], out[1], out[2])


def _attended_codes(codebook: Tensor, codes: Tensor, keys: Tensor, quant: Tensor) -> Tensor:
    """The codes the attention reads (no gradient), ``(B, H, T, d)`` in the keys' dtype: the codebook's ``S`` rows
    cast, then gathered (not ``N`` rows gathered, then cast: a key-sized read and write less). With several heads,
    gathered in the keys' layout where it is ``(B, T, H, d)`` (a model's projection) or contiguous (``codes (H, N)``
    reordered to it, a small integer copy): the fused attention reads them, and hands back their gradient to the keys,
    in the keys' layout, with no copy either way. Else ``(H, N, d)`` (the keys' layout with one head or one sequence):
    ``quant`` itself where the dtypes agree (one gather for both)."""
    b, h, t, d = keys.shape
    source = codebook.detach().to(keys.dtype)  # (H, S, d)
    heads_inner = keys.transpose(1, 2).is_contiguous()
    if h > 1 and (heads_inner or (b > 1 and keys.is_contiguous())):
        rows = (codes + torch.arange(h, device=codes.device)[:, None] * source.shape[1]).view(h, b, t)
        rows = rows.permute(1, 2, 0) if heads_inner else rows.transpose(0, 1)  # in the keys' order
        value = source.flatten(0, 1)[rows.reshape(-1)].view(*rows.shape, d)
        return value.transpose(1, 2) if heads_inner else value
    value = (
        quant.detach()
        if keys.dtype == codebook.dtype
        else torch.gather(source, 1, codes[..., None].expand(h, -1, d))
    )
    return value.view(h, b, t, d).transpose(0, 1)


def key_sums(keys: Tensor, codes: Tensor, codebook_size: int) -> Tensor:
    """The sum of the keys ``(H, N, d)`` that took each code (``codes (H, N)``): ``(H, S, d)`` in the keys' dtype."""
    h, n, d = keys.shape
    sums = keys.new_zeros(h, codebook_size, d)
    return sums.scatter_add_(1, codes[..., None].expand(h, n, d), keys)


def code_statistics(k: Tensor, codes: Tensor, codebook: Tensor, sums: bool) -> CodeStatistics:
    """:class:`CodeStatistics` of keys ``k (B, H, T, d)`` (any layout whose last dimension is contiguous) with codes
    ``codes (H, N)`` of ``codebook (H, S, d)`` (held constant; its fp32 values are the codes, its rows cast to ``k``'s
    dtype are what ``rows`` holds): one kernel, and in the backward one more for ``sq_error``'s gradient. Eager only:
    an autograd function of two launches, not a custom op (whose dispatch took more of the host's time than the ATen
    launches it replaced: the H200 of 2026-11-30, twenty-sixth session); compiled, the plain ops fuse instead."""
    c = codebook.detach()
    with torch.autocast(k.device.type, enabled=False):
        rows, moments, counts, key_sum = _FusedStatistics.apply(
            k, codes, c.float().contiguous(), c.to(k.dtype).contiguous(), sums
        )
    return CodeStatistics(rows, moments[0], moments[1].detach(), counts, key_sum if sums else None)


@functools.cache
def statistics_kernels(interpret: bool) -> ModuleType:
    """:mod:`.statistics_kernel`, decorated for the interpreter or for the GPU (looked up once per mode)."""
    return load_kernels(Path(__file__).with_name("statistics_kernel.py"), __package__, interpret)


def _strides(x: Tensor) -> tuple[int, int, int]:
    """The batch, head and position strides of ``x (B, H, T, d)``."""
    return x.stride(0), x.stride(1), x.stride(2)


def _launch_shape(k: Tensor) -> tuple[bool, int, tuple[int, int], dict[str, int]]:
    """Whether ``k`` is interpreted (on CPU), the programs a head, the grid and the kernels' launch constants."""
    b, h, t, d = k.shape
    interpret = k.device.type == "cpu"
    rows = ROWS[interpret]
    programs = cdiv(b * t, rows)
    return interpret, programs, (programs, h), {"BM": rows, "DK": padded_dim(d), "num_warps": 4}


def _last_contiguous(k: Tensor) -> Tensor:
    return k if k.stride(-1) == 1 else k.contiguous()


def launch_statistics(
    k: Tensor, codes: Tensor, codebook: Tensor, rows_source: Tensor, sums: bool
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The kernel's launch: ``(rows, moments (2,) fp32 [Σ||k - C_z||², Σ||k||²], counts, sums)`` (``sums`` empty where
    not asked for); ``codebook`` fp32, ``rows_source`` the codebook in ``k``'s dtype, both ``(H, S, d)`` contiguous."""
    k = _last_contiguous(k)
    b, h, t, d = k.shape
    s = codebook.shape[1]
    rows = torch.empty_like(k)
    counts = torch.zeros(h, s, device=k.device)
    key_sum = torch.zeros(h, s, d, device=k.device) if sums else counts.new_empty(0)
    interpret, programs, grid, meta = _launch_shape(k)
    partial = torch.empty(2, h, programs, device=k.device)
    if b * t:
        statistics_kernels(interpret).statistics_kernel[grid](
            k, codes, codebook, rows_source, rows, partial, counts, key_sum if sums else counts,
            t, b * t, s, d, programs, *_strides(k), *_strides(rows), SUMS=sums, **meta,
        )  # fmt: skip
    return rows, partial.sum((1, 2)), counts, key_sum


def launch_error_grad(k: Tensor, codes: Tensor, codebook: Tensor, grad: Tensor) -> Tensor:
    """``grad[0] · ∂ Σ||k - C_z||² / ∂k = 2·grad[0]·(k - C_z)`` in ``k``'s dtype and layout (``grad`` fp32, its first
    element read by the kernel: no host read, no indexing launch)."""
    k = _last_contiguous(k)
    b, h, t, d = k.shape
    dk = torch.empty_like(k)
    interpret, _, grid, meta = _launch_shape(k)
    if b * t:
        statistics_kernels(interpret).error_grad_kernel[grid](
            k, codes, codebook, grad, dk, t, b * t, codebook.shape[1], d, *_strides(k), *_strides(dk), **meta
        )  # fmt: skip
    return dk


class _FusedStatistics(torch.autograd.Function):
    """:func:`launch_statistics` with the squared error's gradient (:func:`launch_error_grad`) reaching the keys."""

    @staticmethod
    def forward(ctx, k: Tensor, codes: Tensor, codebook: Tensor, rows_source: Tensor, sums: bool) -> tuple:  # noqa: ANN001
        out = launch_statistics(k, codes, codebook, rows_source, sums)
        ctx.mark_non_differentiable(out[0], *out[2:])
        ctx.save_for_backward(k, codes, codebook)
        return out

    @staticmethod
    def backward(ctx, _rows: Tensor, moments: Tensor, *_: Tensor) -> tuple:  # noqa: ANN001
        k, codes, codebook = ctx.saved_tensors
        dk = (
            launch_error_grad(k, codes, codebook, moments.float().contiguous())
            if ctx.needs_input_grad[0]
            else None
        )
        return dk, None, None, None, None


__all__ = [
    "CodeMetrics",
    "CodeStatistics",
    "code_statistics",
    "fused_metrics",
    "key_sums",
    "launch_error_grad",
    "launch_statistics",
    "plain_metrics",
    "plain_statistics",
    "statistics_kernels",
]
