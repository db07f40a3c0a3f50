"""The Transformer-XL window bias written from its formula, for tests: sinusoids of each signed distance built
here with :mod:`math`, projected with the module's parameters (``W_r``, ``v``) only; nothing of
:class:`~tvq_exp.nn.position.XLRelativeBias` but its weights and its window ``M`` is used."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from tvq_exp.nn.position import XLRelativeBias

BASE = 1e5  # the sinusoids' base (the official code's, and XLRelativeBias's default)


def sinusoid(distance: int, dim: int, base: float = BASE) -> Tensor:
    """``[sin(d·ω_0) .. sin(d·ω_{n-1}) | cos(d·ω_0) .. cos(d·ω_{n-1})]`` with ``ω_m = base^(-2m/dim)``, fp64 ``(dim,)``;
    ``d`` may be negative (the sine half changes sign, the cosine half does not)."""
    angles = [distance * base ** (-2 * m / dim) for m in range(dim // 2)]
    return torch.tensor([math.sin(a) for a in angles] + [math.cos(a) for a in angles], dtype=torch.float64)


def xl_bias_matrix(bias: XLRelativeBias, q: Tensor, causal: bool) -> Tensor:
    """``(B, H, T, T)`` in ``q``'s dtype (differentiable): ``(q_i + s·v)·r_{i-j}`` with ``r_d = s·W_r·sinusoid(d)``
    and ``s = d_k^-1/4``, for ``0 <= i - j <= M`` (``causal``) or ``|i - j| <= M`` (two-sided), zero elsewhere."""
    weight, v = bias.proj.weight.to(q.dtype), bias.v.to(q.dtype)
    heads, d_k = v.shape
    s = d_k**-0.25
    qv = q + s * v[None, :, None, :]
    t = q.shape[2]
    rows = []
    for i in range(t):
        row = [q.new_zeros(q.shape[0], heads)] * t
        for j in range(t):
            d = i - j
            if abs(d) <= bias.max_distance and (d >= 0 or not causal):
                r = s * (weight @ sinusoid(d, weight.shape[1]).to(q.dtype)).view(heads, d_k)
                row[j] = (qv[:, :, i] * r[None]).sum(-1)
        rows.append(torch.stack(row, dim=-1))
    return torch.stack(rows, dim=-2)


def content_query(bias: XLRelativeBias, q: Tensor) -> Tensor:
    """``q + s·u`` (``s = d_k^-1/4``): the query of the content term, from the parameter ``u``."""
    u = bias.u.to(q.dtype)
    return q + u.shape[-1] ** -0.25 * u[None, :, None, :]
