"""Kernelised linear attention (Katharopoulos et al. 2020; FAVOR+ of Choromanski et al. 2021).

``o_i = φ(q_i)ᵀ S_i / (φ(q_i)ᵀ z_i + ε)`` with ``S_i = Σ_{j<=i} φ(k_j) v_jᵀ`` and
``z_i = Σ_{j<=i} φ(k_j)`` (encoder: sums over all ``j``). Computed chunk-wise: a masked quadratic
inside each chunk plus the running state of the earlier chunks, so the chunk size never changes the
result and single-token decoding is the same code path with ``T = 1``. Features, state and the
normaliser are kept in the accumulation dtype (fp32 under autocast).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Unpack

import torch
import torch.nn.functional as F
from torch import Tensor

from tvq_exp.attention.base import AttentionBackend, Aux, Shape, State, accumulation_dtype
from tvq_exp.measure.flops import chunked_flops, mm, padded, with_backward
from tvq_exp.options import NonNegativeFloat, OneOf, PositiveInt, checked

FEATURE_MAPS = ("elu1", "relu", "favor")


@dataclass(eq=False)
class LinearState(State):
    """Linear attention's state: ``s = Σ φ(k) vᵀ (B, H_kv, d_f, d_v)`` and ``z = Σ φ(k) (B, H_kv, d_f)`` (accumulation
    dtype)."""

    s: Tensor
    z: Tensor


class LinearAttention(AttentionBackend):
    """Causal (or encoder) linear attention with a positive feature map.

    Args:
        shape: ``d_k, d_v, heads, causal, kv_heads`` (see :class:`~tvq_exp.attention.base.AttentionBackend`).
        feature_map: ``elu1`` (``elu(x) + 1``), ``relu`` or ``favor`` (positive orthogonal random
            features ``exp(ωᵀx - |x|²/2)/√m``; query features are rescaled per token by their max).
        chunk_size: positions per chunk of the parallel form (any value gives the same result).
        eps: added to the normaliser ``φ(q)ᵀz``.
        num_features: ``m`` random features for ``favor`` (default ``d_k``).
        seed: seed of the ``favor`` projection; :meth:`redraw` draws the next one.

    No relative position bias (``supports_position_bias`` is False): blocks use RoPE or no positions with it.

    Shapes: ``q (B, H, T, d_k)``, ``k (B, H_kv, T, d_k)``, ``v (B, H_kv, T, d_v)`` -> ``(B, H, T, d_v)``.
    State: :class:`LinearState` (the encoder form carries none: a plain :class:`State`).
    """

    @checked
    def __init__(
        self,
        *,
        feature_map: Annotated[str, OneOf(*FEATURE_MAPS)] = "elu1",
        chunk_size: PositiveInt = 64,
        eps: NonNegativeFloat = 1e-6,
        num_features: PositiveInt | None = None,
        seed: int = 0,
        **shape: Unpack[Shape],
    ) -> None:
        super().__init__(**shape)
        self.feature_map, self.chunk_size, self.eps = feature_map, chunk_size, eps
        self.num_features = num_features or self.d_k
        self.seed, self.draws = seed, 0
        if feature_map == "favor":
            self.register_buffer("projection", self._draw_projection())

    @property
    def d_f(self) -> int:
        """Feature dimension ``d_f`` of ``φ``."""
        return self.num_features if self.feature_map == "favor" else self.d_k

    def flops(self, seq_len: int, batch: int = 1, backward: bool = False) -> int:
        """Causal: chunks of ``C = min(chunk_size, T)`` (``T`` padded to whole chunks), see
        :func:`~tvq_exp.measure.flops.chunked_flops`. Encoder: ``Σ φ(k)vᵀ`` once per key/value head
        (``2T·d_f·d_v``) and ``φ(q)·S`` per query head (``2T·d_f·d_v``). ``favor`` adds the random
        projection ``x·ωᵀ`` of queries and keys (``2T·d_k·m`` per head; ``ω`` is a buffer, so its
        backward is one matmul)."""
        heads, kv_heads, d_f = self.heads, self.kv_heads, self.d_f
        if self.causal:
            chunk = min(self.chunk_size, seq_len)
            attend = chunked_flops(padded(seq_len, chunk), chunk, d_f, self.d_v, heads, kv_heads)
        else:
            attend = (heads + kv_heads) * mm(d_f, self.d_v, seq_len)
        total = with_backward(batch * attend, backward)
        if self.feature_map == "favor":
            total += batch * (heads + kv_heads) * mm(seq_len, d_f, self.d_k) * (2 if backward else 1)
        return total

    def state_floats(self, seq_len: int) -> int:
        """``S (d_f, d_v)`` and ``z (d_f)`` per key/value head, whatever ``seq_len``."""
        return self.kv_heads * self.d_f * (self.d_v + 1)

    @torch.no_grad()
    def redraw(self) -> None:
        """Replace the ``favor`` projection by the next seeded draw (a carried state becomes stale)."""
        if self.feature_map != "favor":
            raise ValueError(
                f"linear attention: redraw() needs feature_map='favor', not {self.feature_map!r}"
            )
        self.draws += 1
        self.projection.copy_(self._draw_projection())

    def _draw_projection(self) -> Tensor:
        """Orthogonal Gaussian rows ``ω (m, d_k)`` with chi-distributed norms, from ``seed + draws``."""
        gen = torch.Generator().manual_seed(self.seed + self.draws)
        blocks, left = [], self.num_features
        while left > 0:
            q, _ = torch.linalg.qr(torch.randn(self.d_k, self.d_k, generator=gen, dtype=torch.float64))
            blocks.append(q.T[:left])
            left -= self.d_k
        norms = torch.randn(self.num_features, self.d_k, generator=gen, dtype=torch.float64).norm(dim=1)
        return (torch.cat(blocks) * norms[:, None]).float()

    def features(self, x: Tensor, query: bool) -> Tensor:
        """``φ(x)`` for ``x (B, H, T, d_k)`` -> ``(B, H, T, d_f)`` in the accumulation dtype."""
        x = x.to(accumulation_dtype(x.dtype))
        if self.feature_map == "elu1":
            return F.elu(x) + 1.0
        if self.feature_map == "relu":
            return F.relu(x)
        logits = x @ self.projection.to(x.dtype).T - x.pow(2).sum(-1, keepdim=True) / 2
        if query:
            logits = logits - logits.amax(-1, keepdim=True)
        return logits.exp() / math.sqrt(self.num_features)

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, state: LinearState | None = None
    ) -> tuple[Tensor, State, Aux]:
        self.check_inputs(q, k, v)
        b, h, t, _ = q.shape
        hk = k.shape[1]
        fq = self.features(q, query=True).view(b, hk, h // hk, t, self.d_f)
        fk = self.features(k, query=False).unsqueeze(2)
        vv = v.to(fk.dtype).unsqueeze(2)
        if not self.causal:
            if state is not None:
                raise ValueError("linear attention: a carried state only makes sense for causal attention")
            s, z = fk.transpose(-1, -2) @ vv, fk.sum(-2)
            out = self._normalise(fq @ s, (fq * z.unsqueeze(-2)).sum(-1))
            return out.reshape(b, h, t, self.d_v).to(v.dtype), State(t), {}
        s0 = fk.new_zeros(b, hk, 1, self.d_f, self.d_v) if state is None else state.s.unsqueeze(2)
        z0 = fk.new_zeros(b, hk, 1, self.d_f) if state is None else state.z.unsqueeze(2)
        out, s, z = self._chunks(fq, fk, vv, s0.to(fk.dtype), z0.to(fk.dtype))
        t0 = 0 if state is None else state.position
        new_state = LinearState(t0 + t, s.squeeze(2).detach(), z.squeeze(2).detach())
        return out.reshape(b, h, t, self.d_v).to(v.dtype), new_state, {}

    def equivalent_position(self, t: int) -> int:
        """0: the position is bookkeeping only (a call reads the sums)."""
        return 0

    def _chunks(
        self, fq: Tensor, fk: Tensor, v: Tensor, s0: Tensor, z0: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Chunk-wise causal form. ``fq (B, Hk, G, T, d_f)``, ``fk (B, Hk, 1, T, d_f)``, ``v (B, Hk, 1, T, d_v)``,
        state ``s0 (B, Hk, 1, d_f, d_v)``, ``z0 (B, Hk, 1, d_f)`` -> ``(out (B, Hk, G, T, d_v), S, z)``."""
        t = fq.shape[3]
        c = min(self.chunk_size, t)
        n = -(-t // c)
        pad = n * c - t
        fq, fk, v = (F.pad(x, (0, 0, 0, pad)).unflatten(3, (n, c)) for x in (fq, fk, v))  # (..., N, C, d)
        scores = (fq @ fk.transpose(-1, -2)).tril()  # (B, Hk, G, N, C, C)
        kv = fk.transpose(-1, -2) @ v  # (B, Hk, 1, N, d_f, d_v)
        kz = fk.sum(-2)  # (B, Hk, 1, N, d_f)
        s_cum, z_cum = s0.unsqueeze(3) + kv.cumsum(3), z0.unsqueeze(3) + kz.cumsum(3)
        s_prev = torch.cat([s0.unsqueeze(3), s_cum[:, :, :, :-1]], dim=3)
        z_prev = torch.cat([z0.unsqueeze(3), z_cum[:, :, :, :-1]], dim=3)
        num = scores @ v + fq @ s_prev
        den = scores.sum(-1) + (fq * z_prev.unsqueeze(-2)).sum(-1)
        out = self._normalise(num, den).flatten(3, 4)[:, :, :, :t]
        return out, s_cum[:, :, :, -1], z_cum[:, :, :, -1]

    def _normalise(self, num: Tensor, den: Tensor) -> Tensor:
        return num / (den + self.eps).unsqueeze(-1)
