"""Gradient estimators of the quantiser: how the task gradient of ``C_z`` reaches the key ``k``.

Both return exactly ``c`` (the code vector) in the forward pass; they differ in the backward.
"""

from __future__ import annotations

import torch
from torch import Tensor

EPS = 1e-12


class _ValueOfCodeGradientOfKey(torch.autograd.Function):
    """:func:`straight_through` as one autograd node: its value is the code (a view), its gradient the key's."""

    @staticmethod
    def forward(ctx, k: Tensor, c: Tensor) -> Tensor:  # noqa: ANN001
        return c

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:  # noqa: ANN001
        return grad, None


def straight_through(k: Tensor, c: Tensor) -> Tensor:
    """``sg(c) + k - sg(k)``: the value ``c``, the gradient passed to ``k`` unchanged (van den Oord et al. 2017).

    One autograd node that computes nothing, forward or backward: the sum written out subtracts and adds two
    key-sized tensors (768 MiB at the GPU check's 32k attention shape, eager)."""
    return _ValueOfCodeGradientOfKey.apply(k, c.detach())


def rotation_trick(k: Tensor, c: Tensor) -> Tensor:
    """The rotation trick (Fifty et al. 2024): ``sg(λR)·k`` with ``λ = ||c|| / ||k||`` and ``R`` the rotation
    in the plane of ``k`` and ``c`` that turns ``k̂ = k/||k||`` onto ``ĉ = c/||c||``:
    ``R = I - 2·r rᵀ + 2·ĉ k̂ᵀ`` with ``r = (k̂ + ĉ) / ||k̂ + ĉ||``. Its value is ``c``; the gradient
    reaching ``k`` is ``λ·Rᵀ g``: rotated with the key, keeping the angle between ``g`` and the code.

    ``k, c (..., d)``; ``R`` is never built: ``R k = k - 2 r (r·k) + 2 ĉ (k̂·k)``, in fp32 at least (the value
    stays exactly ``c`` in ``k``'s dtype).
    """
    dtype = k.dtype
    k, c = (x.to(torch.promote_types(dtype, torch.float32)) for x in (k, c))
    k0, c0 = k.detach(), c.detach()
    k_norm = k0.norm(dim=-1, keepdim=True).clamp_min(EPS)
    c_norm = c0.norm(dim=-1, keepdim=True)
    k_unit, c_unit = k0 / k_norm, c0 / c_norm.clamp_min(EPS)
    r = k_unit + c_unit
    r = r / r.norm(dim=-1, keepdim=True).clamp_min(EPS)
    dot = lambda a, b: (a * b).sum(-1, keepdim=True)  # noqa: E731
    rotated = (c_norm / k_norm) * (k - 2 * r * dot(r, k) + 2 * c_unit * dot(k_unit, k))
    return (c0 + (rotated - rotated.detach())).to(dtype)


__all__ = ["rotation_trick", "straight_through"]
