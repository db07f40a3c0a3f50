"""Optimisation pieces of the Lightning module: the LR schedule, AdamW's parameter groups, the finiteness check."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import Tensor, nn
from torch.distributed.tensor import DTensor


def warmup_cosine(step: int, warmup_steps: int, max_steps: int, min_ratio: float) -> float:
    """LR multiplier at optimiser ``step``: linear warmup ``0 -> 1`` over ``warmup_steps``, then cosine
    ``1 -> min_ratio`` at ``max_steps`` (constant afterwards)."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, max_steps - warmup_steps))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def parameter_groups(
    model: nn.Module, weight_decay: float, mode: str, no_decay_ids: set[int]
) -> list[dict[str, object]]:
    """AdamW groups ``[decayed, not decayed]`` of ``model``'s trainable parameters.

    ``adamw`` mode: matrices decay by AdamW's own ``weight_decay`` (embeddings and ``no_decay_ids``, the
    codebooks, never). ``official`` mode (the official code's): every non-vector parameter outside
    ``no_decay_ids`` is in the first group with AdamW's decay off; the module applies ``p <- (1 - wd) p``
    itself before each step.
    """
    skip = set(no_decay_ids)
    if mode == "adamw":
        skip |= {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            decayed = (p.dim() >= 2 if mode == "adamw" else p.dim() != 1) and id(p) not in skip
            (decay if decayed else no_decay).append(p)
    adamw_decay = weight_decay if mode == "adamw" else 0.0
    return [{"params": decay, "weight_decay": adamw_decay}, {"params": no_decay, "weight_decay": 0.0}]


def all_finite(loss: Tensor, parameters: Iterable[nn.Parameter]) -> Tensor:
    """Whether ``loss`` and every gradient (this rank's shard) are finite: a 0-d bool tensor on ``loss``'s device,
    computed there (nothing is read on the host).

    Checked by mixed precision's own multi-tensor check (GradScaler's, with a scale of exactly 1: every value is
    kept; the loss through a copy): one launch per dtype on a GPU, not two per parameter (a 48-layer model has
    about 400 gradients)."""
    found, one = torch.zeros((), device=loss.device), torch.ones((), device=loss.device)
    groups: dict[tuple[torch.device, torch.dtype], list[Tensor]] = {}
    checked = [loss.detach().reshape(1).clone(), *(local(p.grad) for p in parameters if p.grad is not None)]
    for x in checked:
        groups.setdefault((x.device, x.dtype), []).append(x)
    for group in groups.values():
        torch._amp_foreach_non_finite_check_and_unscale_(group, found, one)
    return found == 0


def local(x: Tensor) -> Tensor:
    """This rank's shard of a ``DTensor`` (FSDP2 parameters and gradients); any other tensor as it is."""
    return x.to_local() if isinstance(x, DTensor) else x


def full_tensor(x: Tensor) -> Tensor:
    """The whole value of a ``DTensor`` (a collective: call it on every rank); any other tensor as it is."""
    return x.full_tensor() if isinstance(x, DTensor) else x
