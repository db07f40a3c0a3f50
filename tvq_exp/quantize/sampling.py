"""Stochastic code assignment: each key draws its code from a Boltzmann distribution over the codes
(soft EM with sampled assignments, Roy et al. 2018), so the forward pass feels, in expectation, a key's small
moves that would never change its nearest code. Annealed to zero temperature it is the nearest-code search."""

from __future__ import annotations

import torch
from torch import Tensor

from tvq_exp.quantize.kmeans import NEAREST_ROWS

EPS = 1e-12


def logit_scale(x: Tensor, codebook: Tensor, nearest: Tensor, temperature: float | Tensor) -> Tensor:
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
    (``-||x - C_s||² / scale`` less the key's own ``||x||²``, which no draw depends on; autocast off inside, as in
    :func:`.kmeans.nearest_code`)."""
    with torch.autocast(x.device.type, enabled=False):
        return _logits(x.float(), codebook.float(), scale)


def _logits(x: Tensor, c: Tensor, scale: Tensor) -> Tensor:
    """:func:`assignment_logits` in the dtype of ``x`` and ``c``."""
    dist = (c * c).sum(-1)[:, None, :] - 2 * x @ c.transpose(-1, -2)
    return -dist / scale.to(dist.dtype)[..., None]


def sampled_code(x: Tensor, codebook: Tensor, nearest: Tensor, temperature: float | Tensor) -> Tensor:
    """One code per key of ``x (H, N, d)`` drawn from ``softmax(-||x - C_s||² / (τ·m))`` (:func:`logit_scale`)
    by the Gumbel-max trick: ``(H, N)``.

    The noise comes from torch's global generator, so activation checkpointing (which replays the RNG
    state) recomputes the same draw. Keys are taken in chunks of rows, as :func:`.kmeans.nearest_code`.
    """
    return _gumbel_max(x, codebook, logit_scale(x, codebook, nearest, temperature), keep_noise=False)[0]


def sampled_code_and_noise(
    x: Tensor, codebook: Tensor, nearest: Tensor, temperature: float | Tensor
) -> tuple[Tensor, Tensor]:
    """The draw of :func:`sampled_code` (the same codes from the same generator state) and its Gumbel noise:
    ``(codes (H, N), noise (H, N, S))``, ``codes = argmax_s(ℓ_s + noise_s)`` with
    ``ℓ = assignment_logits(x, codebook, logit_scale(x, codebook, nearest, temperature))`` and
    ``noise = -log(E)``, ``E ~ Exp(1)``, fp32. The noise is what :func:`relaxed_code` relaxes the draw with
    (it keeps ``H·N·S`` floats, where :func:`sampled_code` keeps one chunk of rows at a time)."""
    codes, noise = _gumbel_max(x, codebook, logit_scale(x, codebook, nearest, temperature), keep_noise=True)
    assert noise is not None
    return codes, noise


def _gumbel_max(x: Tensor, codebook: Tensor, scale: Tensor, keep_noise: bool) -> tuple[Tensor, Tensor | None]:
    """``argmax_s(ℓ_s + g_s)`` per chunk of rows, the noise ``g`` drawn chunk by chunk (kept if asked)."""
    codes, noises = [], []
    for part in x.split(NEAREST_ROWS, dim=1):
        logits = assignment_logits(part, codebook, scale)
        gumbel = -torch.empty_like(logits).exponential_().log()
        codes.append((logits + gumbel).argmax(-1))
        if keep_noise:
            noises.append(gumbel)
    return torch.cat(codes, dim=1), (torch.cat(noises, dim=1) if keep_noise else None)


def relaxed_code(x: Tensor, codebook: Tensor, scale: Tensor, noise: Tensor) -> Tensor:
    """The Gumbel-softmax relaxation of the draw (Jang et al. 2017; Maddison et al. 2017): ``x (H, N, d)``,
    ``codebook (H, S, d)``, ``scale (H, 1)`` (``τ·m``, :func:`logit_scale`; a constant, detached),
    ``noise (H, N, S)`` (the draw's, :func:`sampled_code_and_noise`) -> ``soft (H, N, d)``,
    ``soft = Σ_s y_s C_s`` with ``y = softmax(ℓ + g)``, ``ℓ = assignment_logits(x, codebook, scale)``; in fp32
    (fp64 for fp64 inputs), autocast off inside.

    Differentiable in ``x`` and ``codebook``: the gradient reaching ``x`` from an upstream ``g_out`` is
    ``(2/scale)·Σ_s y_s (C_s - c̄)(C_s·g_out)``, ``c̄ = Σ_s y_s C_s`` (the relaxed code itself). Its backward
    keeps ``y``: ``H·N·S`` floats.
    """
    dtype = torch.promote_types(torch.promote_types(x.dtype, codebook.dtype), torch.float32)
    with torch.autocast(x.device.type, enabled=False):
        c = codebook.to(dtype)
        y = (_logits(x.to(dtype), c, scale.detach()) + noise.to(dtype)).softmax(-1)
        return y @ c


def relaxation(
    x: Tensor, codebook: Tensor, nearest: Tensor, noise: Tensor, temperature: float | Tensor
) -> Tensor:
    """The ``relaxed`` estimator's term ``soft - sg(soft)``, ``(H, N, d)``: zero in value, the relaxation's
    gradient in the backward (Jang et al. 2017; Maddison et al. 2017).

    In training with ``assignment="sampled"`` the code is drawn as ``z = argmax_s(ℓ_s + g_s)`` with
    ``ℓ = assignment_logits(k', C, scale)`` (``scale = logit_scale(...) = τ·m``, treated as a constant, no
    gradient) and Gumbel noise ``g`` (:func:`sampled_code_and_noise`). The relaxed code is ``y = softmax(ℓ + g)``
    (the SAME noise ``g`` as the draw), ``soft = Σ_s y_s C_s`` (:func:`relaxed_code`). The quantised key is
    ``k_hat = sg(C_z) + (k' - sg(k')) + (soft - sg(soft))``: its VALUE is exactly ``C_z``, the gradient is
    straight-through's plus the relaxation's. The relaxation's gradient to the key is
    ``(2/scale)·Σ_s y_s (C_s - c̄)(C_s·g_out)`` with ``c̄ = Σ_s y_s C_s`` and ``g_out`` the upstream gradient;
    ``codebook`` gets the relaxation's gradient too where it has one (``update=gradient``/``affine``; EMA codes
    are buffers).

    ``x (H, N, d)``: the search keys ``k'`` with their gradient (normalised under ``normalize``), fp32 at least;
    ``nearest (H, N)``: their nearest codes (for ``m``); ``noise (H, N, S)``: the draw's. Where ``temperature``
    is a 0-d tensor the term is zeroed where it is 0 (annealed) by ``torch.where`` on the device (no host read),
    computed meanwhile at ``τ = 1`` so that its masked backward stays finite: exactly straight-through.
    """
    live = None
    if isinstance(temperature, Tensor):
        live = temperature > 0
        temperature = torch.where(live, temperature, torch.ones_like(temperature))
    soft = relaxed_code(x, codebook, logit_scale(x.detach(), codebook.detach(), nearest, temperature), noise)
    term = soft - soft.detach()
    return term if live is None else torch.where(live, term, torch.zeros_like(term))


__all__ = [
    "assignment_logits",
    "logit_scale",
    "relaxation",
    "relaxed_code",
    "sampled_code",
    "sampled_code_and_noise",
]
