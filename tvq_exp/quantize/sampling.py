"""Stochastic code assignment: each key draws its code from a Boltzmann distribution over the codes
(soft EM with sampled assignments, Roy et al. 2018), so the forward pass feels, in expectation, a key's small
moves that would never change its nearest code. Annealed to zero temperature it is the nearest-code search."""

from __future__ import annotations

import torch
from torch import Tensor

from tvq_exp.quantize.kmeans import NEAREST_ROWS

EPS = 1e-12


def logit_scale(x: Tensor, codebook: Tensor, nearest: Tensor, temperature: float) -> Tensor:
    """``τ·m`` per head, ``(H, 1)``: ``m`` is the head's mean squared distance from a key of ``x (H, N, d)`` to
    its ``nearest (H, N)`` code of ``codebook (H, S, d)`` (the quantisation error of this process's batch; under
    DDP each rank uses its own), so ``τ`` is free of the keys' scale: at ``τ = 1`` a code one mean quantisation
    error farther than the nearest is ``e`` times less likely."""
    x, c = x.float(), codebook.float()
    h, n, d = x.shape
    err = (x - torch.gather(c, 1, nearest[..., None].expand(h, n, d))).pow(2).sum(-1)
    return temperature * err.mean(-1, keepdim=True).clamp_min(EPS)


def assignment_logits(x: Tensor, codebook: Tensor, scale: Tensor) -> Tensor:
    """Log-probabilities, up to a constant per key, of each key's codes: ``x (H, N, d)``,
    ``codebook (H, S, d)``, ``scale (H, 1)`` -> ``(H, N, S)``, ``-(||C_s||² - 2·x·C_s) / scale`` in fp32
    (``-||x - C_s||² / scale`` less the key's own ``||x||²``, which no draw depends on)."""
    x, c = x.float(), codebook.float()
    dist = (c * c).sum(-1)[:, None, :] - 2 * x @ c.transpose(-1, -2)
    return -dist / scale[..., None]


def sampled_code(x: Tensor, codebook: Tensor, nearest: Tensor, temperature: float) -> Tensor:
    """One code per key of ``x (H, N, d)`` drawn from ``softmax(-||x - C_s||² / (τ·m))`` (:func:`logit_scale`)
    by the Gumbel-max trick: ``(H, N)``.

    The noise comes from torch's global generator, so activation checkpointing (which replays the RNG
    state) recomputes the same draw. Keys are taken in chunks of rows, as :func:`.kmeans.nearest_code`.
    """
    scale = logit_scale(x, codebook, nearest, temperature)
    chunks = []
    for part in x.split(NEAREST_ROWS, dim=1):
        logits = assignment_logits(part, codebook, scale)
        gumbel = -torch.empty_like(logits).exponential_().log()
        chunks.append((logits + gumbel).argmax(-1))
    return torch.cat(chunks, dim=1)


__all__ = ["assignment_logits", "logit_scale", "sampled_code"]
