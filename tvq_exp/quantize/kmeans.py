"""Lloyd's k-means per head, synchronised across ranks (codebook initialisation)."""

from __future__ import annotations

import torch
from torch import Tensor

from tvq_exp.quantize.sync import all_reduce_sum, broadcast_from_rank0


def nearest_code(x: Tensor, codebook: Tensor) -> Tensor:
    """Index of the nearest code, in fp32: ``x (H, N, d)``, ``codebook (H, S, d)`` -> ``(H, N)``."""
    x, c = x.float(), codebook.float()
    d2 = (x * x).sum(-1, keepdim=True) - 2 * x @ c.transpose(-1, -2) + (c * c).sum(-1).unsqueeze(-2)
    return d2.argmin(-1)


def kmeans(x: Tensor, num_codes: int, iters: int = 10, generator: torch.Generator | None = None) -> Tensor:
    """k-means of ``x: (H, N, d)`` into ``(H, num_codes, d)`` centroids (fp32).

    Initial centroids are sampled from rank 0's points (with replacement when ``N < num_codes``) and
    broadcast; each Lloyd step all-reduces per-code sums and counts, so every rank ends with the
    same centroids. Empty clusters keep their previous centroid.
    """
    h, n, d = x.shape
    x = x.float()
    idx = torch.randint(0, n, (h, num_codes), generator=generator, device="cpu").to(x.device)
    centroids = broadcast_from_rank0(torch.gather(x, 1, idx[..., None].expand(h, num_codes, d)).contiguous())
    for _ in range(iters):
        codes = nearest_code(x, centroids)
        sums = torch.zeros_like(centroids).scatter_add_(1, codes[..., None].expand(h, n, d), x)
        counts = torch.zeros(h, num_codes, device=x.device).scatter_add_(1, codes, torch.ones_like(codes, dtype=x.dtype))
        all_reduce_sum(sums)
        all_reduce_sum(counts)
        centroids = torch.where(counts[..., None] > 0, sums / counts.clamp_min(1)[..., None], centroids)
    return centroids
