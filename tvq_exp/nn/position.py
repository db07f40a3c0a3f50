"""Positional schemes: Transformer-XL relative bias (windowed) and rotary embeddings."""

from __future__ import annotations

from typing import Annotated

import torch
from torch import Tensor, nn

from tvq_exp.options import AtLeast, Between, NonNegativeInt, PositiveInt, checked


def sinusoid_table(n: int, dim: int, base: float = 1e5) -> Tensor:
    """Sinusoidal embeddings of the integers ``0..n-1``: ``(n, dim)`` (dim even), fp32."""
    if dim % 2:
        raise ValueError(f"sinusoid dim must be even, got {dim}")
    pos = torch.arange(n, dtype=torch.float64)[:, None]
    inv = base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    ang = pos * inv[None, :]
    return torch.cat([ang.sin(), ang.cos()], dim=-1).float()


class XLRelativeBias(nn.Module):
    """Transformer-XL relative position bias, applied only inside a window of ``max_distance``, as the
    official Transformer-VQ code builds it.

    The attention logit between query ``i`` and key ``j`` becomes
    ``(q_i + s·u)·k_j + (q_i + s·v)·r_{i-j}`` where ``r_d = s·W_r·dropout(sinusoid(d))`` and the second term
    is zero unless ``0 <= i - j <= max_distance``. The sinusoids (base 1e5, ``[sin | cos]``) have width
    ``sinusoid_dim`` (the model width in the official code, so the patterns over ``M + 1`` distances are not
    limited by ``d_k``); ``s = d_k^-1/4`` (the official ``τ^-1/2``, the same scale as the queries and keys);
    ``W_r`` starts as ``N(0, 1/sinusoid_dim)`` and ``u, v`` as zero. ``dropout`` drops sinusoid entries
    (training), one mask per call, shared by every block of the call.

    Shapes: ``u, v: (H, d_k)``; :meth:`rel` is ``(H, max_distance + 1, d_k)``.
    """

    @checked
    def __init__(
        self,
        heads: PositiveInt,
        d_k: PositiveInt,
        max_distance: NonNegativeInt,
        sinusoid_dim: Annotated[int, AtLeast(2)] | None = None,
        dropout: Annotated[float, Between(0, 1, "[)")] = 0.0,
        base: float = 1e5,
    ) -> None:
        super().__init__()
        self.heads, self.d_k, self.max_distance = heads, d_k, max_distance
        self.scale = d_k**-0.25
        self.u = nn.Parameter(torch.zeros(heads, d_k))
        self.v = nn.Parameter(torch.zeros(heads, d_k))
        d_sin = sinusoid_dim or d_k
        d_sin += d_sin % 2
        self.proj = nn.Linear(d_sin, heads * d_k, bias=False)
        nn.init.normal_(self.proj.weight, std=d_sin**-0.5)
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("table", sinusoid_table(max_distance + 1, d_sin, base), persistent=False)

    def _project(self, table: Tensor) -> Tensor:
        """``s·W_r·dropout(table)`` for a ``(n, d_sin)`` table: ``(H, n, d_k)``."""
        r = self.proj(self.dropout(table.to(self.proj.weight.dtype))) * self.scale
        return r.view(table.shape[0], self.heads, self.d_k).transpose(0, 1)

    def rel(self) -> Tensor:
        """Projected relative embeddings ``(H, M + 1, d_k)`` for distances ``0..M``."""
        return self._project(self.table)

    def content_query(self, q: Tensor) -> Tensor:
        """``q + s·u`` for ``q: (B, H, ..., d_k)``."""
        return q + (self.u * self.scale).view(1, self.heads, *([1] * (q.dim() - 3)), self.d_k).to(q.dtype)

    def position_query(self, q: Tensor) -> Tensor:
        """``q + s·v`` for ``q: (B, H, ..., d_k)``: the query of the relative (distance) term."""
        return q + (self.v * self.scale).view(1, self.heads, *([1] * (q.dim() - 3)), self.d_k).to(q.dtype)

    def distance_logits(self, q: Tensor, rel: Tensor | None = None) -> Tensor:
        """``(q + v)·r_d`` for all window distances: ``(B, H, ..., M + 1)`` (``rel``: :meth:`rel`, if
        already computed)."""
        qv = self.position_query(q)
        rel = (self.rel() if rel is None else rel).to(q.dtype)  # (H, M+1, d_k)
        shape = qv.shape
        out = torch.matmul(qv.reshape(shape[0], shape[1], -1, shape[-1]), rel.transpose(-1, -2).unsqueeze(0))
        return out.view(*shape[:-1], self.max_distance + 1)

    def bias(self, q: Tensor, distance: Tensor, rel: Tensor | None = None) -> Tensor:
        """Bias for queries ``q: (B, H, ..., Tq, d_k)`` against keys at ``distance: (Tq, Tk)``
        (query position minus key position): ``(B, H, ..., Tq, Tk)``, zero outside ``[0, M]``."""
        dl = self.distance_logits(q, rel)
        inside = (distance >= 0) & (distance <= self.max_distance)
        idx = distance.clamp(0, self.max_distance).expand(*dl.shape[:-1], distance.shape[-1])
        return dl.gather(-1, idx).masked_fill(~inside, 0.0)

    def signed_rel(self) -> Tensor:
        """Projected sinusoids of the signed distances ``-M..M`` (encoders): ``(H, 2M + 1, d_k)``.

        ``sinusoid(-d)`` is ``sinusoid(d)`` with its sine half negated (sine is odd, cosine even).
        """
        half = self.table.shape[1] // 2
        negative = torch.cat([-self.table[1:, :half], self.table[1:, half:]], dim=1).flip(0)
        return self._project(torch.cat([negative, self.table], dim=0))

    def encoder_bias(self, q: Tensor, distance: Tensor, rel: Tensor | None = None) -> Tensor:
        """Two-sided bias ``(q_i + v)·r_{i-j}`` for ``|i - j| <= M`` (zero beyond), for encoders.

        ``q (B, H, ..., Tq, d_k)``, ``distance (Tq, Tk)`` (query minus key position) ->
        ``(B, H, ..., Tq, Tk)``. Equals :meth:`bias` wherever ``distance >= 0``. ``rel``:
        :meth:`signed_rel`, if already computed.
        """
        m = self.max_distance
        qv = self.position_query(q)
        rel = (self.signed_rel() if rel is None else rel).to(q.dtype)
        shape = qv.shape
        logits = torch.matmul(
            qv.reshape(shape[0], shape[1], -1, shape[-1]), rel.transpose(-1, -2).unsqueeze(0)
        )
        logits = logits.view(*shape[:-1], 2 * m + 1)
        idx = (distance.clamp(-m, m) + m).expand(*logits.shape[:-1], distance.shape[-1])
        return logits.gather(-1, idx).masked_fill(distance.abs() > m, 0.0)


def apply_rope(x: Tensor, positions: Tensor, base: float = 10000.0) -> Tensor:
    """Rotary position embedding of ``x: (B, H, T, d)`` at integer ``positions: (T,)`` (d even)."""
    d = x.shape[-1]
    if d % 2:
        raise ValueError(f"RoPE needs an even head dim, got {d}")
    inv = base ** (-torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)
    ang = positions.to(torch.float32)[:, None] * inv[None, :]
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


__all__ = ["XLRelativeBias", "apply_rope", "sinusoid_table"]
