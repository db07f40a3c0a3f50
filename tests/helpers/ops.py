"""The aten ops a piece of code calls, recorded under a dispatch mode (which sees each op the code calls, not the ops
inside them): on a GPU each one that is not a view is a kernel launch, and each copy a pass over memory."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class Op(NamedTuple):
    """One call: the op (``aten.clone``), whether it is a view or the wrapping of a Python number (no launch), and
    its first result's size and dtype (``numel`` 0 and ``dtype`` None without a tensor result)."""

    name: str
    free: bool
    numel: int
    dtype: torch.dtype | None


class OpLog(TorchDispatchMode):
    """Every aten op called inside it, in order (:class:`Op`)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[Op] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        first = next((t for t in tree_leaves(out) if isinstance(t, torch.Tensor)), None)
        free = func.is_view or func is torch.ops.aten.scalar_tensor.default
        self.ops.append(Op(str(func.overloadpacket), free, 0 if first is None else first.numel(),
                           None if first is None else first.dtype))  # fmt: skip
        return out

    def launches(self) -> list[Op]:
        """The calls that launch work on a GPU: not views (``detach`` among them) nor wrapped numbers."""
        return [op for op in self.ops if not op.free]

    def named(self, *names: str) -> list[Op]:
        """The calls of the ops ``names`` (``"aten.clone"``, ...)."""
        return [op for op in self.ops if op.name in names]
