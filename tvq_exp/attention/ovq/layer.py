"""Online vector-quantised attention (OVQ-attention; Alonso, Figliolia & Millidge 2026, arXiv 2602.03922).

Over 300 lines: one algorithm; the online k-means decisions (growth, seeding, assignment, merge), the
differentiable dictionary, the block read and the carried state share one block layout and state
invariants, and the helpers serve only it (the reusable running means already live in ``vq/cache.py``).

Transformer-VQ reads far keys through a codebook trained across sequences. OVQ-attention instead
learns a key dictionary ``D_k (S, d_k)`` and a value dictionary ``D_v (S, d_v)`` *inside each
sequence*, by online k-means with sparse (nearest-centroid) updates. Positions come in blocks of
``L``; query ``i`` in block ``r`` attends to

- the keys of blocks ``r-1`` and ``r`` exactly (causally), with the XL bias for distances ``<= M``;
- the dictionary after absorbing blocks ``0..r-2``: centroid ``n`` with count ``c_n`` is scored
  ``(q_i + u)·D_k[n] + log c_n`` and contributes ``D_v[n]``.

Absorbing a block (a batch k-means step, see :meth:`OVQAttention._decide`):

1. growth: the dictionary holds ``n(t) = min(S, ⌈α·ln(1 + t/α)⌉)`` centroids after ``t`` absorbed
   positions (the expected cluster count of a Dirichlet process, capped: it plateaus at ``S``);
2. seeding: the block's new centroids are its keys farthest from every centroid so far (greedy
   farthest-point, the deterministic form of k-means++), or its first keys (``seeding="first"``);
3. assignment: every key of the block goes to its nearest centroid (squared Euclidean distance);
4. update: ``c_n += m_n`` and ``D[n] += (m_n / c_n)·(mean of its new keys / values − D[n])``: the
   per-centroid ``1/count`` (Newton) step, so ``D_k[n]``, ``D_v[n]`` are the exact means of the keys
   and values assigned to ``n``. Only the assigned centroids change (a sparse update).

Because centroids are running means, the read equals softmax attention in which every absorbed key
and value is replaced by its centroid's means. The discrete decisions (seeds, assignments) are
taken without gradient; given them the dictionary is an exact differentiable function of the keys
and values (:func:`~tvq_exp.attention.vq.cache.running_code_means`, with its exact backward), so
gradients reach the absorbed keys and values unless ``grad_through_dictionary=False``.

Cost per layer: ``O(T·(2L + S)·(d_k + d_v))`` for the read plus ``O(T·S·d_k)`` for the assignments.
The decisions are sequential over blocks (block ``r``'s assignment needs the dictionary after block
``r-1``), vectorised over batch, heads and the ``L`` keys of a block; the read runs all blocks at
once. A carried state (the keys and values since the start of the previous block, the dictionary)
is prepended, so segments may start anywhere: continuation and token-by-token decoding share one
code path and equal the parallel forward.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Unpack

import torch
import torch.nn.functional as F
from torch import Tensor

from tvq_exp.attention.base import Aux, Shape, State, accumulation_dtype, own_copy
from tvq_exp.attention.blocked import (
    BlockedAttention,
    BlockLayout,
    resolve_window,
    window_floats,
    window_start,
)
from tvq_exp.attention.vq.cache import block_stats, running_code_means
from tvq_exp.measure.flops import mm, with_backward
from tvq_exp.options import NonNegativeInt, OneOf, OptionError, PositiveFloat, PositiveInt, checked

SEEDINGS = ("farthest", "first")


@dataclass(eq=False)
class OVQState(State):
    """OVQ's state (accumulation dtype): the keys ``k (B, H_kv, W, d_k)`` and values ``v (B, H_kv, W, d_v)`` since the
    start of the previous block; the dictionary: ``keys (B, H_kv, S, d_k)``, ``values (B, H_kv, S, d_v)`` centroids
    and their ``counts (B, H_kv, S)`` (float64: exact integers at any length)."""

    k: Tensor
    v: Tensor
    keys: Tensor
    values: Tensor
    counts: Tensor


class OVQAttention(BlockedAttention):
    """OVQ-attention backend (decoder only).

    Args:
        shape: ``d_k, d_v, heads, causal, kv_heads`` (see :class:`~tvq_exp.attention.base.AttentionBackend`);
            ``causal`` must be True (the dictionary is learned online, left to right); one dictionary per kv head.
        num_centroids: ``S``, dictionary slots per key/value head (the plateau of the growth).
        block_len: ``L``, positions per block: the exact window spans blocks ``r-1, r`` and the
            dictionary absorbs one block at a time.
        window_len: ``M``, the window of the Transformer-XL relative bias a block hands over, inside the exact
            window (default ``block_len``; at most ``block_len``).
        growth_scale: ``α`` of the growth ``n(t) = min(S, ⌈α·ln(1 + t/α)⌉)`` (default ``S / 4``:
            the dictionary fills after about ``(e^4 − 1)·α ≈ 13.6·S`` positions).
        seeding: ``farthest`` (spread-maximising) or ``first`` (the block's first keys).
        grad_through_dictionary: gradients reach the keys and values through the dictionary.

    Shapes: ``q (B, H, T, d_k)``, ``k (B, H_kv, T, d_k)``, ``v (B, H_kv, T, d_v)`` -> ``(B, H, T, d_v)``.
    State: :class:`OVQState`: the positions ``max(0, (t//L − 1)·L) .. t−1`` and the dictionary.
    """

    supports_encoder = False

    @checked
    def __init__(
        self,
        *,
        num_centroids: PositiveInt = 512,
        block_len: PositiveInt = 512,
        window_len: NonNegativeInt | None = None,
        growth_scale: PositiveFloat | None = None,
        seeding: Annotated[str, OneOf(*SEEDINGS)] = "farthest",
        grad_through_dictionary: bool = True,
        **shape: Unpack[Shape],
    ) -> None:
        super().__init__(**shape)
        window_len = resolve_window(window_len, block_len, type(self))
        if growth_scale is not None and not math.isfinite(growth_scale):
            raise OptionError("growth_scale", growth_scale, "must be finite (a number > 0)", type(self))
        self.num_centroids, self.block_len, self.window_len = num_centroids, block_len, window_len
        self.growth_scale = float(num_centroids / 4 if growth_scale is None else growth_scale)
        self.seeding, self.grad_through_dictionary = seeding, grad_through_dictionary

    def active_centroids(self, blocks: int) -> int:
        """Centroids in use after absorbing ``blocks`` blocks: ``min(S, ⌈α·ln(1 + t/α)⌉)``, ``t = blocks·L``
        positions. Its slope is at most 1: a block adds at most ``L`` centroids (seeded from its keys)."""
        t = blocks * self.block_len
        return min(self.num_centroids, math.ceil(self.growth_scale * math.log1p(t / self.growth_scale)))

    def full_block(self) -> int | None:
        """The fewest absorbed blocks after which every centroid is in use (:meth:`active_centroids` is ``S``), or
        None where that lies past any position (``α·(e^((S − 1)/α) − 1)`` positions overflow)."""
        alpha, s = self.growth_scale, self.num_centroids
        x = (s - 1) / alpha  # active == S once α·ln(1 + t/α) > S − 1: t > α·(e^x − 1)
        if x > 40 * math.log(2):  # past 2^40·α positions: never in a run
            return None
        b = max(0, math.floor(alpha * math.expm1(x) / self.block_len) - 2)  # a guess; the function decides
        while b > 0 and self.active_centroids(b - 1) == s:
            b -= 1
        while self.active_centroids(b) < s:
            b += 1
        return b

    def equivalent_position(self, t: int) -> int:
        """``t`` until every centroid is in use for the blocks a call at ``t`` absorbs (from the state's first block,
        ``⌊t/L⌋ − 1``, on), then ``(m + 1)·L + t mod L``, ``m`` the first such block past block 0: a call adds no
        centroid there, sees the dictionary, keeps the window from a block before its last block start, and reads
        the position only through ``t mod L`` and differences of block indices. ``t`` where the dictionary never
        fills (:meth:`full_block` None)."""
        full = self.full_block()
        if full is None:
            return t
        start = (max(full, 1) + 1) * self.block_len
        return t if t < start else start + t % self.block_len

    def flops(self, seq_len: int, batch: int = 1, backward: bool = False) -> int:
        """Per query row one product with the ``2L`` window keys plus, once some query block sees an
        absorbed block (``T > 2L``), the ``S`` centroids, and one with the matching values (plus the XL
        bias); per absorbed block (``max(0, ⌊T/L⌋ − 1)`` of them) and key/value head the distances
        ``(L, d_k)·(d_k, S)``, without gradient. Query rows: ``T`` padded to whole blocks (a single
        block: its ``T`` rows). The backward doubles the read and the bias, not the assignments."""
        L, S, heads, d_k, d_v = self.block_len, self.num_centroids, self.heads, self.d_k, self.d_v
        last = (seq_len - 1) // L  # block of the last query
        rows = seq_len if last == 0 else (last + 1) * L
        keys = 2 * L + (S if last >= 2 else 0)
        attend = heads * (mm(rows, keys, d_k) + mm(rows, d_v, keys))
        absorbed = max(0, seq_len // L - 1)
        total = batch * (with_backward(attend, backward) + self.kv_heads * absorbed * mm(L, S, d_k))
        return total + self.bias_flops(batch * rows, backward)

    def state_floats(self, seq_len: int) -> int:
        """Keys and values since the start of the previous block, and the dictionary (``S`` key and
        value centroids and counts), per key/value head."""
        window = window_floats(seq_len, self.block_len, self.d_k + self.d_v)
        return self.kv_heads * (window + self.num_centroids * (self.d_k + self.d_v + 1))

    def empty_state(self, k: Tensor) -> OVQState:
        """State of a fresh sequence for keys like ``k (B, H_kv, ·, d_k)`` (accumulation dtype; the counts float64, as
        every later state's)."""
        b, h, _, d_k = k.shape
        s, acc = self.num_centroids, accumulation_dtype(k.dtype)
        new = {"dtype": acc, "device": k.device}
        return OVQState(
            position=0,
            k=torch.zeros(b, h, 0, d_k, **new),
            v=torch.zeros(b, h, 0, self.d_v, **new),
            keys=torch.zeros(b, h, s, d_k, **new),
            values=torch.zeros(b, h, s, self.d_v, **new),
            counts=torch.zeros(b, h, s, dtype=torch.float64, device=k.device),
        )

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, state: OVQState | None = None
    ) -> tuple[Tensor, OVQState, Aux]:
        self.check_inputs(q, k, v)
        state = self.empty_state(k) if state is None else state
        acc = accumulation_dtype(q.dtype)
        t0, t = state.position, q.shape[2]
        p0 = t0 - state.k.shape[2]  # block-aligned position of the buffer's first key
        keys = torch.cat([state.k.to(acc), k.to(acc)], dim=2)
        values = torch.cat([state.v.to(acc), v.to(acc)], dim=2)
        first_block = p0 // self.block_len
        absorbed = max(0, (t0 + t) // self.block_len - 1 - first_block)  # blocks leaving the window
        codes, centroids = self._decide(keys, state, first_block, absorbed)
        counts, means = self._dictionary(keys, values, codes, state)
        layout = BlockLayout.of(t0 - p0, t, self.block_len)
        sees_dictionary = t0 + t > 2 * self.block_len  # the last query block is past block 1
        out = self._attend(q.to(acc), keys, values, counts, means, layout, sees_dictionary)
        new_state = self._next_state(keys, values, counts, means, centroids, t0 + t, p0)
        return out.to(v.dtype), new_state, {"ovq_used": (new_state.counts > 0).float().mean()}

    @torch.no_grad()
    def _decide(
        self, keys: Tensor, state: OVQState, first_block: int, absorbed: int
    ) -> tuple[Tensor, Tensor]:
        """The discrete part of absorbing blocks ``first_block .. first_block + absorbed − 1`` (the first
        ``absorbed`` blocks of ``keys (B, H_kv, n, d_k)``), block by block: seeds, then assignments.

        Returns the codes ``(B·H_kv, absorbed, L)`` and the key centroids ``(B·H_kv, S, d_k)`` after the
        last block (seeds included: a seed left without keys keeps its position, count 0)."""
        b, hk, _, d_k = keys.shape
        L, S = self.block_len, self.num_centroids
        blocks = keys[:, :, : absorbed * L].detach().reshape(b * hk, absorbed, L, d_k)
        centroids = state.keys.to(keys.dtype).flatten(0, 1).clone()
        counts = state.counts.to(keys.dtype).flatten(0, 1)
        seed = _seed_farthest if self.seeding == "farthest" else _seed_first
        codes = []
        for j in range(absorbed):
            old = self.active_centroids(first_block + j)
            new = self.active_centroids(first_block + j + 1) - old
            dist = _distances(blocks[:, j], centroids, old)
            seed(blocks[:, j], centroids, dist, old, new)
            code = dist.argmin(-1)  # (N, L): nearest active centroid
            counts, centroids = _merge(code, blocks[:, j], counts, centroids, S)
            codes.append(code)
        return torch.stack(codes, 1) if codes else blocks.new_zeros(b * hk, 0, L, dtype=torch.long), centroids

    def _dictionary(
        self, keys: Tensor, values: Tensor, codes: Tensor, state: OVQState
    ) -> tuple[Tensor, Tensor]:
        """Differentiable dictionary before each absorbed block and after the last: counts
        ``(B·H_kv, A + 1, S)`` and means of ``[key, value]`` ``(B·H_kv, A + 1, S, d_k + d_v)``."""
        n, absorbed, L = codes.shape
        n0 = state.counts.double().flatten(0, 1)  # exact counts, as running_code_means returns them
        mu0 = torch.cat([state.keys, state.values], dim=-1).to(keys.dtype).flatten(0, 1)
        if absorbed == 0:
            return n0[:, None], mu0[:, None]
        kv = torch.cat([keys, values], dim=-1)[:, :, : absorbed * L].reshape(n, absorbed, L, -1)
        kv = kv if self.grad_through_dictionary else kv.detach()
        valid = torch.ones(absorbed, L, dtype=torch.bool, device=codes.device)
        return running_code_means(codes, kv, valid, n0, mu0)

    def _attend(
        self, q: Tensor, keys: Tensor, values: Tensor, counts: Tensor, means: Tensor, layout: BlockLayout,
        sees_dictionary: bool,
    ) -> Tensor:  # fmt: skip
        """Outputs ``(B, H, T, d_v)`` of the queries ``q (B, H, T, d_k)``, placed by ``layout`` among
        the buffered ``keys (B, H_kv, n, d_k)``, ``values (B, H_kv, n, d_v)``: per query block ``r``
        (``I`` items of ``rows`` rows) one softmax over its ``2L`` window keys and, if
        ``sees_dictionary``, the ``S`` centroids of dictionary entry ``max(r − 1, 0)`` (``counts``,
        ``means`` from :meth:`_dictionary`)."""
        b, h, t, d_k = q.shape
        hk, L = keys.shape[1], self.block_len
        g, items, rows = h // hk, layout.items, layout.rows
        qi = layout.to_items(q)  # (B, H, I, rows, d_k)
        # the keys and values of blocks r - 1 and r, (B, Hk, I, 2L, d)
        window_k, window_v = (_windows(x, layout.first, items, L) for x in (keys, values))
        key_pos = torch.arange(-L, L, device=q.device)  # relative to the start of the query's block
        dist = layout.positions(q.device)[:, None] - key_pos  # (rows, 2L): query minus key position
        has_prev = torch.arange(layout.first, layout.first + items, device=q.device) > 0  # not block 0
        visible = (dist >= 0) & (has_prev[:, None, None] | (key_pos >= 0))  # (I, rows, 2L)
        extra = torch.zeros(visible.shape, dtype=q.dtype, device=q.device).masked_fill(~visible, -math.inf)
        extra = extra.expand(b, h, -1, -1, -1)  # (B, H, I, rows, 2L): mask, then bias and log-counts
        qc = qi
        if self.bias is not None:
            qc = self.bias.content_query(qi)
            extra = extra + self.bias.bias(qi, dist)
        all_k, all_v = window_k, window_v
        if sees_dictionary:
            entry = (torch.arange(layout.first, layout.first + items, device=q.device) - 1).clamp_min(0)
            n, mu = (x[:, entry].unflatten(0, (b, hk)) for x in (counts, means))  # (B, Hk, I, S, ·)
            log_n = torch.where(n > 0, n.clamp_min(1e-30).log(), -math.inf).to(q.dtype)
            all_k = torch.cat([window_k, mu[..., :d_k].to(q.dtype)], dim=3)
            all_v = torch.cat([window_v, mu[..., d_k:].to(q.dtype)], dim=3)
            log_n = log_n.repeat_interleave(g, 1)[:, :, :, None]  # (B, H, I, 1, S)
            extra = torch.cat([extra, log_n.expand(-1, -1, -1, rows, -1)], dim=-1)
        logits = qc.unflatten(1, (hk, g)) @ all_k[:, :, None].transpose(-1, -2)  # (B, Hk, G, I, rows, W)
        weights = torch.softmax(logits + extra.unflatten(1, (hk, g)), dim=-1)
        out = (weights @ all_v[:, :, None]).flatten(1, 2)  # (B, H, I, rows, d_v)
        return layout.from_items(out)

    def _next_state(
        self,
        keys: Tensor,
        values: Tensor,
        counts: Tensor,
        means: Tensor,
        centroids: Tensor,
        t_end: int,
        p0: int,
    ) -> OVQState:
        """State after position ``t_end``: the buffer from the start of the previous block, the
        dictionary after the last absorbed block (key centroids from :meth:`_decide`, seeds kept)."""
        b, hk = keys.shape[:2]
        start = window_start(t_end, self.block_len) - p0
        return OVQState(
            position=t_end,
            k=own_copy(keys[:, :, start:].detach()),
            v=own_copy(values[:, :, start:].detach()),
            keys=centroids.view(b, hk, self.num_centroids, -1),
            values=own_copy(means[:, -1, :, self.d_k :].detach().reshape(b, hk, self.num_centroids, -1)),
            counts=own_copy(counts[:, -1].detach().reshape(b, hk, self.num_centroids)),
        )


def _windows(x: Tensor, first: int, items: int, block_len: int) -> Tensor:
    """Window of blocks ``r − 1, r`` for ``r = first .. first + items − 1`` of ``x (B, Hk, n, d)``:
    ``(B, Hk, I, 2L, d)``; block ``−1`` and the tail past ``n`` are zeros (masked by the caller)."""
    n_blocks = -(-x.shape[2] // block_len)
    x = F.pad(x, (0, 0, block_len, n_blocks * block_len - x.shape[2])).unflatten(2, (n_blocks + 1, block_len))
    return torch.cat([x[:, :, first : first + items], x[:, :, first + 1 : first + items + 1]], dim=3)


def _distances(keys: Tensor, centroids: Tensor, active: int) -> Tensor:
    """Squared distances ``(N, L, S)`` of ``keys (N, L, d_k)`` to ``centroids (N, S, d_k)``; ``+inf``
    for the slots ``>= active``."""
    cross = keys @ centroids.transpose(-1, -2)
    dist = keys.pow(2).sum(-1, keepdim=True) - 2 * cross + centroids.pow(2).sum(-1)[:, None]
    unused = torch.arange(centroids.shape[1], device=keys.device) >= active
    return dist.masked_fill(unused, math.inf)


def _seed_farthest(keys: Tensor, centroids: Tensor, dist: Tensor, old: int, new: int) -> None:
    """Greedy farthest-point seeding, in place: slots ``old .. old + new − 1`` of ``centroids (N, S, d_k)``
    become, one by one, the key of ``keys (N, L, d_k)`` farthest from every centroid so far (the
    first on ties, the block's first key when the dictionary is empty); ``dist (N, L, S)`` gets
    their columns."""
    nearest = dist.amin(-1)  # (N, L); +inf while the dictionary is empty
    rows = torch.arange(keys.shape[0], device=keys.device)
    for slot in range(old, old + new):
        seed = keys[rows, nearest.argmax(-1)]  # (N, d_k)
        centroids[:, slot] = seed
        dist[:, :, slot] = (keys - seed[:, None]).pow(2).sum(-1)
        nearest = torch.minimum(nearest, dist[:, :, slot])


def _seed_first(keys: Tensor, centroids: Tensor, dist: Tensor, old: int, new: int) -> None:
    """Seeding by the block's first ``new`` keys, in place (see :func:`_seed_farthest`)."""
    seeds = keys[:, :new]
    centroids[:, old : old + new] = seeds
    dist[:, :, old : old + new] = (keys[:, :, None] - seeds[:, None]).pow(2).sum(-1)


def _merge(code: Tensor, keys: Tensor, counts: Tensor, centroids: Tensor, size: int) -> tuple[Tensor, Tensor]:
    """One batch k-means step: ``c += m``, ``D += (m / c)·(mean − D)`` per centroid, for the keys
    ``(N, L, d_k)`` with codes ``(N, L)``; the arithmetic of :func:`running_code_means`."""
    valid = torch.ones(1, code.shape[1], dtype=torch.bool, device=code.device)
    block_counts, block_means = block_stats(code[:, None], keys[:, None], valid, size)
    total = counts + block_counts[:, 0]
    weight = (block_counts[:, 0] / total.clamp_min(1))[..., None]
    return total, torch.lerp(centroids, block_means[:, 0], weight)


__all__ = ["SEEDINGS", "OVQAttention"]
