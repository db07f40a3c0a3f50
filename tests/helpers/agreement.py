"""Agreement of an implementation with its reference: outputs and gradients under one seeded cotangent."""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Sequence
from typing import Any

import torch

Reference = Callable[..., torch.Tensor]  # reference(attention in float64, q, k, v) -> (B, H, T, D_v)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest absolute difference relative to the largest magnitude of ``b`` (in float64)."""
    return ((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-30)).item()


def grad_pairs(
    out: torch.Tensor,
    ref: torch.Tensor,
    inputs: Sequence[torch.Tensor],
    ref_inputs: Sequence[torch.Tensor] | None = None,
    seed: int = 1,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``(d<out, g>/dx, d<ref, g>/dx')`` for each ``x`` of ``inputs`` and ``x'`` of ``ref_inputs`` (by default
    the same inputs), for one cotangent ``g`` drawn in float64 from ``seed`` and cast to each output's dtype."""
    g = torch.randn(ref.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    grads = torch.autograd.grad(out, tuple(inputs), g.to(out.dtype))
    ref_grads = torch.autograd.grad(ref, tuple(inputs if ref_inputs is None else ref_inputs), g.to(ref.dtype))
    return list(zip(grads, ref_grads, strict=True))


def check_attention_against_reference(
    attn: torch.nn.Module, reference: Reference, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tol: float
) -> torch.Tensor:
    """``attn(q, k, v)`` in the inputs' dtype against ``reference`` run on a float64 copy of ``attn`` and of the
    inputs: the output and its q/k/v gradients to relative error ``tol``. Returns the output ``(B, H, T, D_v)``."""
    ref_attn = copy.deepcopy(attn).double()
    out = attn(q, k, v)[0]
    q64, k64, v64 = (x.detach().double().requires_grad_(True) for x in (q, k, v))
    ref = reference(ref_attn, q64, k64, v64)
    assert out.dtype == q.dtype and out.shape == ref.shape
    assert rel_err(out, ref) < tol
    for name, (grad, ref_grad) in zip("qkv", grad_pairs(out, ref, (q, k, v), (q64, k64, v64)), strict=True):
        assert rel_err(grad, ref_grad) < tol, name
    return out


def attend_in_pieces(
    attn: torch.nn.Module,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cuts: Sequence[int] | None = None,
) -> tuple[torch.Tensor, Any]:
    """``attn`` over the pieces ``[cuts[i], cuts[i + 1])`` of the time axis one after the other, the state
    carried (``cuts`` from 0 to T; ``None``: one position at a time). Returns the outputs joined,
    ``(B, H, T, D_v)``, and the last state."""
    cuts = range(q.shape[2] + 1) if cuts is None else cuts
    state, parts = None, []
    for start, stop in itertools.pairwise(cuts):
        piece = slice(start, stop)
        out, state, _ = attn(q[:, :, piece], k[:, :, piece], v[:, :, piece], state)
        parts.append(out)
    return torch.cat(parts, 2), state


__all__ = ["attend_in_pieces", "check_attention_against_reference", "grad_pairs", "rel_err"]
