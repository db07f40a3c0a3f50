"""Lloyd's k-means per head, synchronised across ranks (codebook initialisation)."""

from __future__ import annotations

import torch
from torch import Tensor

from tvq_exp.nn.triton_loader import has_triton
from tvq_exp.quantize.fused_nearest import search_codes  # (and registers torch.ops.tvq.nearest_code)
from tvq_exp.quantize.sync import all_reduce_sum, broadcast_from_rank0

NEAREST_ROWS = 2048  # rows per chunk of the code search on a CPU: (rows, S) fp32 distances stay in cache
# on CUDA without Triton, (H, rows, S) fp32 distances per chunk (128 MiB): few launches. One H100 (2026-11-27) ran
# the search at 128k keys per head as 64 chunks of 2048 rows, three kernels each, about 2.3 ms of a 17 ms attention
# layer; in 8 chunks, its fp32 matmul on the CUDA cores, 3.3 ms of 13.7; the fused kernel takes 1.3 ms
NEAREST_ELEMENTS_CUDA = 1 << 25
# CUDA searches in the fused kernel where Triton is installed: read once here, as a constant torch.compile folds (a
# call to has_triton() inside a compiled step is a graph break: dynamo does not trace importlib)
FUSED_SEARCH = has_triton()


def fused_search(x: Tensor) -> bool:
    """Whether :func:`nearest_code` searches ``x`` with the fused kernel: on CUDA, where Triton is installed."""
    return x.is_cuda and FUSED_SEARCH


def nearest_chunk_rows(device_type: str, heads: int, codes: int) -> int:
    """Rows per chunk of :func:`nearest_code` on ``device_type`` for ``heads`` heads of ``codes`` codes."""
    if device_type != "cuda":
        return NEAREST_ROWS
    return max(NEAREST_ROWS, NEAREST_ELEMENTS_CUDA // (heads * codes))


def nearest_code(x: Tensor, codebook: Tensor) -> Tensor:
    """Index of the nearest code, in fp32 (also under autocast): ``x (H, N, d)``, ``codebook (H, S, d)`` ->
    ``(H, N)``. On CUDA with Triton, one fused kernel (:mod:`.fused_nearest`), which reads bf16 keys as they are;
    elsewhere :func:`plain_nearest_code`."""
    if fused_search(x):  # the codebook's pieces made here: compiled, they fuse into the step's kernels
        return torch.ops.tvq.nearest_code(
            x.detach(), *search_codes(codebook.detach(), x.dtype)
        )  # no gradient
    return plain_nearest_code(x, codebook)


def plain_nearest_code(x: Tensor, codebook: Tensor) -> Tensor:
    """:func:`nearest_code` by torch's ops, the fused kernel's reference.

    ``argmin_s ||x - c_s||² = argmin_s (||c_s||² - 2·x·c_s)``: per chunk of rows, one matmul with the
    (exactly) scaled codes ``-2·C`` and one in-place add. Autocast is off inside: a bf16 product would round the
    distances to 8 bits and pick another code for keys between two codes.
    """
    x, c = x.float(), codebook.float()
    rows = nearest_chunk_rows(x.device.type, *c.shape[:2])
    with torch.autocast(x.device.type, enabled=False):
        c2, scaled = (c * c).sum(-1).unsqueeze(-2), (-2 * c).transpose(-1, -2)
        chunks = [(part @ scaled).add_(c2).argmin(-1) for part in x.split(rows, dim=1)]
    return torch.cat(chunks, dim=1)


def kmeans(x: Tensor, num_codes: int, iters: int = 10, generator: torch.Generator | None = None) -> Tensor:
    """k-means of ``x: (H, N, d)`` into ``(H, num_codes, d)`` centroids (fp32).

    Initial centroids are chosen by k-means++ (D² sampling) from rank 0's points and broadcast;
    each Lloyd step all-reduces per-code sums and counts, so every rank ends with the same
    centroids. Empty clusters keep their previous centroid.
    """
    h, n, d = x.shape
    x = x.float()
    centroids = broadcast_from_rank0(kmeans_plus_plus(x, num_codes, generator))
    for _ in range(iters):
        codes = nearest_code(x, centroids)
        sums = torch.zeros_like(centroids).scatter_add_(1, codes[..., None].expand(h, n, d), x)
        counts = torch.zeros(h, num_codes, device=x.device).scatter_add_(
            1, codes, torch.ones_like(codes, dtype=x.dtype)
        )
        all_reduce_sum(sums)
        all_reduce_sum(counts)
        centroids = torch.where(counts[..., None] > 0, sums / counts.clamp_min(1)[..., None], centroids)
    return centroids


def kmeans_plus_plus(x: Tensor, num_codes: int, generator: torch.Generator | None = None) -> Tensor:
    """k-means++ seeding per head: ``x (H, N, d)`` -> ``(H, num_codes, d)``.

    Each new centroid is a point drawn with probability proportional to its squared distance to the
    nearest centroid so far (uniformly when all points are already covered).
    """
    h, n, d = x.shape
    rows = torch.arange(h, device=x.device)
    first = torch.randint(0, n, (h,), generator=generator).to(x.device)
    chosen = [x[rows, first]]
    best = ((x - chosen[0][:, None]) ** 2).sum(-1)  # (H, N)
    for _ in range(1, num_codes):
        weights = torch.where(best.sum(-1, keepdim=True) > 0, best, torch.ones_like(best))
        pick = torch.multinomial(weights.cpu(), 1, generator=generator).squeeze(-1).to(x.device)
        chosen.append(x[rows, pick])
        best = torch.minimum(best, ((x - chosen[-1][:, None]) ** 2).sum(-1))
    return torch.stack(chosen, 1)
