"""Transformer-VQ attention: quantised keys, an exact two-block window and a compressive cache.

Query ``i`` in block ``r`` (blocks of ``L`` positions) attends to
- blocks ``r-1`` and ``r`` exactly (causally), with the XL bias for distances ``<= window_len``;
- blocks ``0..r-2`` through the cache: per code ``s`` a count ``n_s`` and the mean value ``μ_s``,
  scored ``(q_i + u)·C_s + log n_s``.
Because quantised keys equal codebook rows, this is exactly softmax attention over the quantised
keys (bias clipped at the window), for every block length ``L >= window_len``. Cost per layer:
``O(T·(2L + S)·(d_k + d_v))``.

All blocks are computed at once. A carried state (the keys and values since the start of the
previous block plus the cache) is prepended as keys only, so a segment may start at any position:
continuation, partial blocks and token-by-token decoding share one code path.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from tvq_exp.attention.base import AttentionBackend, Aux, State, accumulation_dtype
from tvq_exp.attention.vq_bidirectional import vq_bidirectional
from tvq_exp.nn.position import XLRelativeBias, window_distances
from tvq_exp.quantize.codebook import VectorQuantizer


class VQAttention(AttentionBackend):
    """Transformer-VQ attention backend (``causal=False``: the encoder form of :mod:`.vq_bidirectional`).

    Args:
        d_k, d_v, heads: per-head key / value sizes and query heads (keys/values may be grouped).
        codebook_size: ``S``, codes per key head.
        block_len: ``L``; the result does not depend on it as long as ``L >= window_len``.
        window_bias: Transformer-XL relative bias inside the window.
        window_len: ``M``, bias window (default ``block_len``).
        use_cache: False drops the compressive cache (a pure two-block sliding window).
        grad_through_cache: let value gradients flow through the cache inside a segment.
        codebook: keyword arguments of :class:`~tvq_exp.quantize.VectorQuantizer` (strategy, decay, ...).

    Shapes: ``q (B, H, T, d_k)``, ``k (B, H_kv, T, d_k)``, ``v (B, H_kv, T, d_v)`` -> ``(B, H, T, d_v)``.
    State: ``k, v, codes`` of positions ``max(0, (t//L - 1)·L) .. t-1``; ``cache_n (B, H_kv, S)``,
    ``cache_mu (B, H_kv, S, d_v)`` summarising all earlier blocks; the position ``t``.
    """

    def __init__(
        self,
        d_k: int,
        d_v: int,
        heads: int = 1,
        codebook_size: int = 512,
        block_len: int = 512,
        window_bias: bool = True,
        window_len: int | None = None,
        use_cache: bool = True,
        grad_through_cache: bool = True,
        causal: bool = True,
        kv_heads: int | None = None,
        codebook: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(d_k, d_v, heads, causal, kv_heads)
        if block_len < 1:
            raise ValueError(f"vq attention: block_len must be >= 1, got {block_len}")
        window_len = block_len if window_len is None else window_len
        if not 0 <= window_len <= block_len:
            raise ValueError(f"vq attention: window_len must be in [0, block_len={block_len}], got {window_len}")
        self.block_len, self.window_len = block_len, window_len
        self.use_cache, self.grad_through_cache = use_cache, grad_through_cache
        self.quantizer = VectorQuantizer(self.kv_heads, codebook_size, d_k, **dict(codebook or {}))
        self.bias = XLRelativeBias(heads, d_k, window_len) if window_bias else None
        self.register_buffer("dist", window_distances(block_len), persistent=False)

    @property
    def codebook(self) -> Tensor:
        """Code vectors in use, ``(H_kv, S, d_k)``."""
        return self.quantizer.codebook

    @property
    def codebook_size(self) -> int:
        return self.quantizer.codebook_size

    def forward(self, q: Tensor, k: Tensor, v: Tensor, state: State | None = None) -> tuple[Tensor, State, Aux]:
        self.check_inputs(q, k, v)
        if not self.causal:
            return vq_bidirectional(self, q, k, v, state)
        k_hat, codes, aux = self.quantizer(k)
        state = state if state is not None else self.empty_state(k)
        t0, t_new = int(state["t"]), q.shape[2]
        n_buf = state["k"].shape[2]
        keys = torch.cat([state["k"].to(k_hat.dtype), k_hat], dim=2)
        values = torch.cat([state["v"].to(v.dtype), v], dim=2)
        all_codes = torch.cat([state["codes"], codes], dim=2)
        queries = torch.cat([q.new_zeros(q.shape[0], q.shape[1], n_buf, q.shape[3]), q], dim=2)
        out, prefix = self._blocks(queries, keys, values, all_codes, state)
        new_state = self._next_state(keys, values, all_codes, prefix, t0, t_new, t0 - n_buf)
        return out[:, :, n_buf:], new_state, aux

    def empty_state(self, k: Tensor) -> State:
        """State of a fresh sequence for keys like ``k (B, H_kv, ·, d_k)``."""
        b, h, _, dk = k.shape
        s = self.quantizer.codebook_size
        return {
            "k": k.new_zeros(b, h, 0, dk),
            "v": k.new_zeros(b, h, 0, self.d_v),
            "codes": torch.zeros(b, h, 0, dtype=torch.long, device=k.device),
            "cache_n": torch.zeros(b, h, s, device=k.device),
            "cache_mu": torch.zeros(b, h, s, self.d_v, device=k.device),
            "t": 0,
        }

    def _blocks(self, q: Tensor, k: Tensor, v: Tensor, codes: Tensor, state: State) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """Attention for a key sequence starting at a block boundary. Returns ``(out, prefix stats)``.

        Each block's queries (all ``G`` query heads of a key head stacked) attend to one key matrix
        ``[block r-1; block r; codebook]`` with one additive term ``[bias + causal mask; log n_s]``:
        a fused ``baddbmm``, one fused softmax (its row max is the shared stop-gradient max) and one
        matmul with ``[values r-1; values r; cache means]``.
        """
        b, h, n, _ = q.shape
        hk, L = k.shape[1], self.block_len
        r = -(-n // L)
        pad = r * L - n
        valid = torch.ones(n, dtype=torch.bool, device=q.device)
        if pad:
            q, k, v = (torch.nn.functional.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
            codes = torch.nn.functional.pad(codes, (0, pad))
            valid = torch.nn.functional.pad(valid, (0, pad))
        g, acc = h // hk, accumulation_dtype(q.dtype)
        qc = q if self.bias is None else self.bias.content_query(q)
        qc = qc.view(b, hk, g, r, L, -1).transpose(2, 3).reshape(b * hk * r, g * L, -1)
        kb, vb = k.view(b, hk, r, L, -1), v.view(b, hk, r, L, -1)
        keys, values = [_shift_blocks(kb), kb], [_shift_blocks(vb), vb]
        add = [self._window_bias(q, (b, hk, g, r), acc)]  # (B, Hk, R, G, L, 2L)

        prefix_n, prefix_mu = self._prefix_stats(codes.view(b, hk, r, L), vb, valid.view(r, L), state)
        if self.use_cache:  # blocks <= r-2: prefix entry r-1
            idx = (torch.arange(r, device=q.device) - 1).clamp_min(0)
            cache_n, cache_mu = prefix_n[:, :, idx], prefix_mu[:, :, idx]  # (B, Hk, R, S[, dv])
            s = cache_n.shape[-1]
            keys.append(self.quantizer.codebook.detach().to(qc.dtype)[None, :, None].expand(b, hk, r, s, -1))
            values.append((cache_mu if self.grad_through_cache else cache_mu.detach()).to(v.dtype))
            log_n = torch.where(cache_n > 0, cache_n.clamp_min(1e-30).log(), float("-inf")).to(acc)
            add.append(log_n[:, :, :, None, None].expand(b, hk, r, g, L, s))
        keys_t = torch.cat(keys, dim=3).view(b * hk * r, -1, qc.shape[-1]).transpose(1, 2)
        bias = torch.cat(add, dim=-1)
        bias[:, :, 0, :, :, :L] = float("-inf")  # block 0 has no previous block
        bias = bias.view(b * hk * r, g * L, -1)
        if qc.dtype == acc:
            scores = torch.baddbmm(bias, qc, keys_t)
        else:
            scores = (qc @ keys_t).to(acc) + bias
        p = torch.softmax(scores, dim=-1)
        out = p.to(v.dtype) @ torch.cat(values, dim=3).view(b * hk * r, -1, v.shape[-1])
        out = out.view(b, hk, r, g, L, -1).transpose(2, 3).reshape(b, h, r * L, -1)
        return out[:, :, :n], (prefix_n, prefix_mu)

    def _window_bias(self, q: Tensor, groups: tuple[int, int, int, int], acc: torch.dtype) -> Tensor:
        """Additive window logits ``(B, Hk, R, G, L, 2L)``: causal mask (−inf) plus the XL bias.

        With the bias, one gather from the distance logits extended by a zero column (visible but
        beyond the window) and a −inf column (masked) builds bias and mask in one pass.
        """
        b, hk, g, r = groups
        L = self.block_len
        if self.bias is None:
            mask = torch.zeros(L, 2 * L, dtype=acc, device=q.device).masked_fill_(self.dist < 0, float("-inf"))
            return mask.expand(b, hk, r, g, L, 2 * L)
        m = self.bias.max_distance
        dl = self.bias.distance_logits(q).view(b, hk, g, r, L, m + 1).transpose(2, 3).to(acc)
        edge = dl.new_tensor([0.0, float("-inf")]).expand(b, hk, r, g, L, 2)
        table = torch.cat([dl, edge], dim=-1)  # (B, Hk, R, G, L, M + 3)
        index = self.dist.clamp_max(m + 1).masked_fill(self.dist < 0, m + 2)
        return table.gather(-1, index.expand(b, hk, r, g, L, 2 * L))

    def _prefix_stats(self, codes: Tensor, vb: Tensor, valid: Tensor, state: State) -> tuple[Tensor, Tensor]:
        """Running (count, mean) per code over ``[state cache, block 0, ..., block R-1]``.

        ``codes (B, Hk, R, L)``, ``vb (B, Hk, R, L, dv)``, ``valid (R, L)`` ->
        ``counts (B, Hk, R+1, S)``, ``means (B, Hk, R+1, S, dv)``; entry ``j`` covers the state's
        cache and blocks ``0..j-1``. Merged as running means (Chan's update), all in fp32.
        """
        b, hk, r, L = codes.shape
        s, dv = self.quantizer.codebook_size, vb.shape[-1]
        acc = accumulation_dtype(vb.dtype)
        vf = (vb if self.grad_through_cache else vb.detach()).to(acc)
        w = valid.to(acc).expand(b, hk, r, L)
        counts = torch.zeros(b, hk, r, s, device=vb.device, dtype=acc).scatter_add_(3, codes, w)
        sums = torch.zeros(b, hk, r, s, dv, device=vb.device, dtype=acc).scatter_add(
            3, codes[..., None].expand(b, hk, r, L, dv), vf * w[..., None]
        )
        means = sums / counts.clamp_min(1)[..., None]
        n_run, mu_run = state["cache_n"].to(acc), state["cache_mu"].to(acc)
        out_n, out_mu = [n_run], [mu_run]
        # unbind once: per-block indexing would give each block an O(R) zero-filled gradient buffer
        for count, mean in zip(counts.unbind(2), means.unbind(2), strict=True):
            n_new = n_run + count
            mu_run = mu_run + (count / n_new.clamp_min(1))[..., None] * (mean - mu_run)
            n_run = n_new
            out_n.append(n_run)
            out_mu.append(mu_run)
        return torch.stack(out_n, 2), torch.stack(out_mu, 2)

    def _next_state(
        self, keys: Tensor, values: Tensor, codes: Tensor, prefix: tuple[Tensor, Tensor], t0: int, t_new: int, p0: int
    ) -> State:
        """State after position ``t0 + t_new``; ``p0`` is the (block-aligned) position of ``keys[:, :, 0]``."""
        L = self.block_len
        t_end = t0 + t_new
        c_end = t_end // L
        start = max(0, (c_end - 1) * L)
        last_cached = c_end - 2 - p0 // L  # index (in this call's blocks) of the newest cached block
        j = max(last_cached + 1, 0)
        return {
            "k": keys[:, :, start - p0 :].detach(),
            "v": values[:, :, start - p0 :].detach(),
            "codes": codes[:, :, start - p0 :],
            "cache_n": prefix[0][:, :, j].detach(),
            "cache_mu": prefix[1][:, :, j].detach(),
            "t": t_end,
        }


def _shift_blocks(x: Tensor) -> Tensor:
    """Block ``r`` gets block ``r-1`` (zeros for ``r = 0``) along dim -3 of ``(..., R, L, d)``."""
    return torch.nn.functional.pad(x, (0, 0, 0, 0, 1, 0))[..., :-1, :, :]
