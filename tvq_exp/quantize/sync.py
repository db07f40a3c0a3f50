"""Collective helpers that are no-ops outside ``torch.distributed``."""

from __future__ import annotations

import torch.distributed as dist
from torch import Tensor


def is_distributed() -> bool:
    """True when a process group is initialised with more than one rank."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def all_reduce_sum(x: Tensor) -> Tensor:
    """Sum ``x`` over all ranks in place (identity on one process); returns ``x``."""
    if is_distributed():
        dist.all_reduce(x, op=dist.ReduceOp.SUM)
    return x


def broadcast_from_rank0(x: Tensor) -> Tensor:
    """Overwrite ``x`` on every rank with rank 0's copy, in place; returns ``x``."""
    if is_distributed():
        dist.broadcast(x, src=0)
    return x
