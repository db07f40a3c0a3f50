"""The batch contract between the data modules and the Lightning module.

A batch is a dict of tensors, every row one sequence segment:

- ``input``: ``(B, T)`` int64 token ids;
- ``target``: ``(B, T)`` int64 next-token ids, :data:`IGNORE_INDEX` where no loss is taken (padding);
- ``reset``: ``(B,)`` bool, True where the row starts a new sequence (the carried state is dropped);
- ``position`` (optional): ``(B,)`` int64, the segment's first position counted from the last reset (the
  state's age), used to resolve the loss by position.

Losses are in nats per target; bits per byte (or per dim for images) = nats / ln 2.
"""

from __future__ import annotations

import torch

IGNORE_INDEX = -100  # torch's cross_entropy default: targets that take no loss

Batch = dict[str, torch.Tensor]

__all__ = ["IGNORE_INDEX", "Batch"]
