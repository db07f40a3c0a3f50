"""Autoregressive sampling from the streaming state (O(1) work per generated token): text continuations,
and images drawn sub-pixel by sub-pixel or completed from their top rows.

Images are ``(N, H, W, C)`` pixel levels flattened row-major with channels interleaved (a reshape; see
:mod:`tvq_exp.data.images.tokens`); their BOS token is ``levels``."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypedDict, Unpack

import torch
from torch import Tensor

from tvq_exp.models.decoder import Decoder


def filter_logits(logits: Tensor, top_k: int | None = None, top_p: float | None = None) -> Tensor:
    """Mask ``logits (B, V)`` to the ``top_k`` largest and the nucleus of mass ``top_p`` (-inf elsewhere)."""
    if top_k is not None and 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, -torch.inf)
    if top_p is not None and 0.0 < top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        # drop a token when the mass of the strictly more likely tokens already reaches top_p
        drop_sorted = probs.cumsum(-1) - probs >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, -torch.inf)
    return logits


class Sampling(TypedDict, total=False):
    """How each token is drawn: :func:`sample_next`'s options, which :func:`generate`, :func:`sample_images` and
    :func:`complete_images` hand on to it."""

    temperature: float
    top_k: int | None
    top_p: float | None
    generator: torch.Generator | None


def sample_next(
    logits: Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Draw one token per row from ``logits (B, V)`` -> ``(B,)``; ``temperature == 0`` is greedy."""
    logits = logits.float()
    if temperature <= 0:
        return logits.argmax(-1)
    probs = filter_logits(logits / temperature, top_k, top_p).softmax(-1)
    if not bool(probs.isfinite().all()):
        raise FloatingPointError("the model's next-token distribution is not finite (diverged weights?)")
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


@torch.no_grad()
def generate(
    model: Decoder,
    prompt_tokens: Tensor,
    n: int,
    *,
    vocab_limit: int | None = None,
    **sampling: Unpack[Sampling],
) -> Tensor:
    """Continue ``prompt_tokens (B, T0)`` (``T0 >= 1``) by ``n`` tokens -> ``(B, n)``, each drawn with ``sampling``
    (:func:`sample_next`).

    The prompt is run once; afterwards each token is fed alone with the carried state, so every step
    costs the same whatever the length so far. ``vocab_limit`` restricts sampling to ids below it (e.g.
    256 bytes for text). The model is put in eval mode and left there.
    """
    if prompt_tokens.dim() != 2 or prompt_tokens.shape[1] < 1:
        raise ValueError(f"prompt_tokens must be (B, T0) with T0 >= 1, got {tuple(prompt_tokens.shape)}")
    model.eval()
    out = model(prompt_tokens)
    tokens = []
    for step in range(n):
        logits = out.logits[:, -1]
        if vocab_limit is not None:
            logits = logits[:, :vocab_limit]
        token = sample_next(logits, **sampling)
        tokens.append(token)
        if step + 1 < n:
            out = model(token[:, None], out.state)
    return torch.stack(tokens, dim=1) if tokens else prompt_tokens.new_zeros(prompt_tokens.shape[0], 0)


def _bos_prompt(n: int, levels: int, device: torch.device) -> Tensor:
    """``(n, 1)`` BOS tokens."""
    return torch.full((n, 1), levels, dtype=torch.long, device=device)


def sample_images(
    model: Decoder, n: int, image_shape: Sequence[int], levels: int, **sampling: Unpack[Sampling]
) -> Tensor:
    """Draw ``n`` images from the BOS prompt (each level drawn with ``sampling``, :func:`sample_next`) ->
    ``(n, H, W, C)`` int64 levels ``0..levels-1``.

    ``image_shape`` is ``(H, W, C)``; the BOS token is never sampled. The model is left in eval mode.
    """
    device = next(model.parameters()).device
    tokens = generate(
        model, _bos_prompt(n, levels, device), math.prod(image_shape), vocab_limit=levels, **sampling
    )
    return tokens.reshape(n, *image_shape)


def complete_images(
    model: Decoder,
    images: Tensor,
    levels: int,
    given_rows: int | None = None,
    **sampling: Unpack[Sampling],
) -> Tensor:
    """Keep the top ``given_rows`` (default ``H // 2``) rows of ``images (N, H, W, C)`` (levels) and sample
    the rest (with ``sampling``, :func:`sample_next`) -> ``(N, H, W, C)`` int64, equal to ``images`` in the given
    rows."""
    n, height, width, channels = images.shape
    given_rows = height // 2 if given_rows is None else given_rows
    if not 0 <= given_rows < height:
        raise ValueError(f"given_rows must be in [0, {height}), got {given_rows}")
    device = next(model.parameters()).device
    known = images.reshape(n, -1).long().to(device)[:, : given_rows * width * channels]
    prompt = torch.cat([_bos_prompt(n, levels, device), known], dim=1)
    rest = generate(model, prompt, (height - given_rows) * width * channels, vocab_limit=levels, **sampling)
    return torch.cat([known, rest], dim=1).reshape(n, height, width, channels)
