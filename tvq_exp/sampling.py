"""Autoregressive sampling from the streaming state: O(1) work per generated token."""

from __future__ import annotations

import torch
from torch import Tensor

from tvq_exp.model import Decoder


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
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


@torch.no_grad()
def generate(
    model: Decoder,
    prompt_tokens: Tensor,
    n: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
    vocab_limit: int | None = None,
) -> Tensor:
    """Continue ``prompt_tokens (B, T0)`` (``T0 >= 1``) by ``n`` tokens -> ``(B, n)``.

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
        token = sample_next(logits, temperature, top_k, top_p, generator)
        tokens.append(token)
        if step + 1 < n:
            out = model(token[:, None], out.state)
    return torch.stack(tokens, dim=1) if tokens else prompt_tokens.new_zeros(prompt_tokens.shape[0], 0)
