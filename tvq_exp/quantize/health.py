"""Codebook health over a set of keys: usage perplexity, dead codes, and the regret against a fresh k-means.

Every function takes keys and codebooks per head, ``keys: (H, N, d)`` and ``codebook: (H, S, d)``, in the space
the nearest-code search works in (a quantiser's ``search_keys(k)`` and ``codebook``), and computes in fp32.

- Usage perplexity: ``exp(entropy)`` of a head's code frequencies, 1 (one code takes every key) to S (uniform).
- Dead codes: a code is dead when it is used fewer than ``share · N/S`` times, a fraction ``share`` of its
  fair share of the ``N`` keys (``share = 0`` would count only the codes no key selects).
- Relative quantisation error: ``Σ ||k - c(k)||² / Σ ||k||²`` over heads and keys, ``c(k)`` the nearest code.
- Regret: the codebook's relative error over that of a fresh k-means with ``S`` codes on the same keys (1: as
  good as k-means; a collapsed codebook scores far above 1; below 1 is possible, Lloyd's only finds a local
  optimum). Where the keys take few distinct values (the first layer of a byte-level model, whose keys depend on
  the byte alone, has at most 256) k-means is nearly exact and the ratio is huge or infinite, rightly but
  unhelpfully: read the two errors there.
- The k-means' usage perplexity: how many codes that fresh k-means uses on those keys, a reference for the
  codebook's own usage (what a codebook that minimises the quantisation error takes from these keys; keys that
  crowd into a few clusters give k-means an uneven usage too).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from tvq_exp.quantize.kmeans import kmeans, nearest_code
from tvq_exp.quantize.sync import all_reduce_sum

DEAD_SHARE = 0.01  # a code used under 1% of its fair share N/S is dead
REGRET_ITERS = 15  # Lloyd iterations of the reference k-means
# The reference error's floor: keys that (nearly) are S points (e.g. layer 0 of a byte model, whose keys are a
# function of the byte) give k-means an error of ~0, and the ratio would measure round-off; below 0.1% of the
# keys' energy the reference counts as 0.1%.
REGRET_FLOOR = 1e-3


class Regret(NamedTuple):
    """The codebook's relative quantisation error, that of a fresh k-means on the same keys, their ratio, and
    the k-means' usage perplexity on those keys (mean over heads; floats, NaN when some rank had no keys)."""

    quant_error: float
    kmeans_error: float
    regret: float
    kmeans_perplexity: float


def code_counts(codes: Tensor, codebook_size: int) -> Tensor:
    """How often each code is selected: ``codes (H, N)`` int -> ``(H, S)`` fp32."""
    counts = torch.zeros(codes.shape[0], codebook_size, device=codes.device)
    return counts.scatter_add_(1, codes.long(), torch.ones_like(codes, dtype=counts.dtype))


def assigned_counts(keys: Tensor, codebook: Tensor) -> Tensor:
    """How many of ``keys (H, N, d)`` take each code of ``codebook (H, S, d)`` as their nearest: ``(H, S)`` fp32."""
    return code_counts(nearest_code(keys, codebook), codebook.shape[1])


def usage_perplexity(counts: Tensor) -> Tensor:
    """``exp`` of the entropy of each head's code frequencies: ``counts (H, S)`` -> ``(H,)`` (1 without keys)."""
    p = counts.float() / counts.float().sum(-1, keepdim=True).clamp_min(1e-12)
    return torch.exp(-(p * p.clamp_min(1e-12).log()).sum(-1))


def dead_fraction(counts: Tensor, share: float = DEAD_SHARE) -> Tensor:
    """Fraction of each head's codes used fewer than ``share · N/S`` times (``N`` = the head's keys; with
    ``share = 0``: never used): ``counts (H, S)`` -> ``(H,)``."""
    if not 0 <= share <= 1:
        raise ValueError(f"share={share!r}: must be in [0, 1] (a fraction of a code's fair share N/S)")
    counts = counts.float()
    fair = counts.sum(-1, keepdim=True) / counts.shape[-1]
    dead = counts <= 0 if share == 0 else counts < share * fair
    return dead.float().mean(-1)


def squared_error(keys: Tensor, codebook: Tensor) -> Tensor:
    """``Σ_n min_s ||k_n - c_s||²`` per head: ``keys (H, N, d)``, ``codebook (H, S, d)`` -> ``(H,)`` fp32."""
    keys, codebook = keys.float(), codebook.float()
    nearest = torch.gather(codebook, 1, nearest_code(keys, codebook)[..., None].expand_as(keys))
    return (keys - nearest).pow(2).sum((-2, -1))


def relative_error(keys: Tensor, codebook: Tensor) -> float:
    """``Σ ||k - c(k)||² / Σ ||k||²`` over every head and key (0 for all-zero keys), summed over ranks."""
    sums = torch.stack([squared_error(keys, codebook).sum(), keys.float().pow(2).sum()])
    error, norm = all_reduce_sum(sums).tolist()
    return error / norm if norm > 0 else 0.0


def codebook_regret(
    keys: Tensor,
    codebook: Tensor,
    iters: int = REGRET_ITERS,
    generator: torch.Generator | None = None,
) -> Regret:
    """The codebook's relative error on ``keys (H, N, d)``, a fresh k-means' (``S`` codes, ``iters`` Lloyd
    steps, k-means++ seeds drawn with the CPU ``generator``) on the same keys, their ratio, and the k-means'
    usage perplexity on the keys (mean over heads).

    The ratio's denominator is at least :data:`REGRET_FLOOR` (k-means is then all but exact: at most about ``S``
    distinct keys), and a codebook at least as good as k-means has regret 1 at most. Collective under DDP: every
    rank calls it with its own keys; k-means and the sums then run over the union of them (NaN everywhere if
    any rank has none, rather than a rank waiting for the others).
    """
    if keys.shape[0] != codebook.shape[0] or keys.shape[-1] != codebook.shape[-1]:
        raise ValueError(f"keys {tuple(keys.shape)} do not match the codebook {tuple(codebook.shape)}")
    empty = all_reduce_sum(torch.tensor([float(keys.shape[1] == 0)], device=keys.device))
    if empty.item() > 0:
        return Regret(*[float("nan")] * len(Regret._fields))
    quant = relative_error(keys, codebook)
    fresh = kmeans(keys.float(), codebook.shape[1], iters, generator)
    reference = relative_error(keys, fresh)
    counts = all_reduce_sum(assigned_counts(keys, fresh))
    usage = float(usage_perplexity(counts).mean())
    return Regret(quant, reference, quant / max(reference, REGRET_FLOOR), usage)


__all__ = [
    "DEAD_SHARE",
    "Regret",
    "assigned_counts",
    "code_counts",
    "codebook_regret",
    "dead_fraction",
    "relative_error",
    "squared_error",
    "usage_perplexity",
]
