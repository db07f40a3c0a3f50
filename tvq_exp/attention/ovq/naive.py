"""Plain reference of OVQ-attention: an explicit token loop over one fresh sequence and key/value head
at a time, the dictionary as Python lists, every decision written out. Written for clarity, not
speed; :class:`~tvq_exp.attention.ovq.OVQAttention` is tested against it.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def ovq_attention(attn, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """:class:`~tvq_exp.attention.ovq.OVQAttention` on fresh sequences, token by token:
    ``q (B, H, T, d_k)``, ``k (B, H_kv, T, d_k)``, ``v (B, H_kv, T, d_v)`` -> ``(B, H, T, d_v)``.

    Before the queries of block ``r >= 2`` the dictionary absorbs block ``r − 2``; query ``i`` then
    attends to the keys from the start of the previous block to ``i`` and to every centroid with a
    nonzero count. Takes the backend only for its parameters."""
    g = q.shape[1] // k.shape[1]
    rel = None if attn.bias is None else attn.bias.rel().to(q.dtype)  # (H, M + 1, d_k)
    batch = []
    for b in range(q.shape[0]):
        heads: list[Tensor] = []
        for kh in range(k.shape[1]):
            group = list(range(kh * g, (kh + 1) * g))
            heads.extend(_sequence(attn, q[b, group], k[b, kh], v[b, kh], group, rel))
        batch.append(torch.stack(heads))
    return torch.stack(batch)


class _Dictionary:
    """Slot ``n``: key centroid ``keys[n] (d_k)``, value centroid ``values[n] (d_v)``, count ``counts[n]``."""

    def __init__(self) -> None:
        self.keys: list[Tensor] = []
        self.values: list[Tensor] = []
        self.counts: list[int] = []

    def absorb(self, attn, k: Tensor, v: Tensor, block: int) -> None:
        """One batch k-means step on block ``block`` of ``k (T, d_k)``, ``v (T, d_v)``: seed the new
        centroids, assign every key to its nearest centroid, move each centroid to the mean of all
        the keys (and values) ever assigned to it."""
        L = attn.block_len
        block_k, block_v = k[block * L : (block + 1) * L], v[block * L : (block + 1) * L]
        new = attn.active_centroids(block + 1) - attn.active_centroids(block)
        for seed in self._seeds(attn.seeding, block_k.detach(), new):
            self.keys.append(seed)
            self.values.append(v.new_zeros(v.shape[-1]))
            self.counts.append(0)
        codes = [self._nearest(key) for key in block_k.detach()]
        if not attn.grad_through_dictionary:
            block_k, block_v = block_k.detach(), block_v.detach()
        for n in sorted(set(codes)):
            members = [j for j, code in enumerate(codes) if code == n]
            c, m = self.counts[n], len(members)
            self.keys[n] = (c * self.keys[n] + sum(block_k[j] for j in members)) / (c + m)
            self.values[n] = (c * self.values[n] + sum(block_v[j] for j in members)) / (c + m)
            self.counts[n] = c + m

    def _seeds(self, seeding: str, keys: Tensor, new: int) -> list[Tensor]:
        """The ``new`` keys of ``keys (L, d_k)`` that become centroids: the first ones, or one by one the
        key farthest from every centroid so far (the first such key on ties)."""
        if seeding == "first":
            return list(keys[:new])
        nearest = [min((_sq_dist(key, c) for c in self.keys), default=math.inf) for key in keys]
        seeds = []
        for _ in range(new):
            best = 0
            for j in range(len(keys)):
                if nearest[j] > nearest[best]:
                    best = j
            seeds.append(keys[best])
            nearest = [min(nearest[j], _sq_dist(keys[j], keys[best])) for j in range(len(keys))]
        return seeds

    def _nearest(self, key: Tensor) -> int:
        """Slot of the centroid nearest to ``key`` (the first on ties)."""
        dists = [_sq_dist(key, c) for c in self.keys]
        return dists.index(min(dists))


def _sequence(attn, q: Tensor, k: Tensor, v: Tensor, heads: list[int], rel: Tensor | None) -> list[Tensor]:
    """Outputs ``(T, d_v)`` of the query heads ``heads`` (``q (G, T, d_k)``) sharing ``k (T, d_k)`` and
    ``v (T, d_v)``, token by token."""
    L = attn.block_len
    dictionary = _Dictionary()
    outs: list[list[Tensor]] = [[] for _ in heads]
    for i in range(q.shape[1]):
        if i % L == 0 and i // L >= 2:
            dictionary.absorb(attn, k, v, block=i // L - 2)
        start = max(0, (i // L - 1) * L)
        for n, head in enumerate(heads):
            outs[n].append(_read(attn, q[n, i], i, head, k, v, start, dictionary, rel))
    return [torch.stack(out) for out in outs]


def _read(
    attn, q_i: Tensor, i: int, head: int, k: Tensor, v: Tensor, start: int, dictionary: _Dictionary,
    rel: Tensor | None,
) -> Tensor:  # fmt: skip
    """Output ``(d_v)`` of query ``q_i`` at position ``i``: one softmax over the window keys
    ``start..i`` (``(q_i + u)·k_j + (q_i + v)·r_{i−j}`` for ``i − j <= M``) and the centroids with a
    count (``(q_i + u)·D_k[n] + log c_n``)."""
    q_content = q_i if attn.bias is None else q_i + (attn.bias.u[head] * attn.bias.scale).to(q_i.dtype)
    logits, values = [], []
    for j in range(start, i + 1):
        logit = q_content @ k[j]
        if rel is not None and i - j <= attn.window_len:
            logit = logit + (q_i + (attn.bias.v[head] * attn.bias.scale).to(q_i.dtype)) @ rel[head, i - j]
        logits.append(logit)
        values.append(v[j])
    for key, value, count in zip(dictionary.keys, dictionary.values, dictionary.counts, strict=True):
        if count > 0:
            logits.append(q_content @ key + math.log(count))
            values.append(value)
    weights = torch.softmax(torch.stack(logits), dim=0)
    return (weights[:, None] * torch.stack(values)).sum(0)


def _sq_dist(a: Tensor, b: Tensor) -> float:
    """``‖a − b‖²`` as a Python float (a decision: no gradient)."""
    return float((a - b).detach().pow(2).sum())


__all__ = ["ovq_attention"]
