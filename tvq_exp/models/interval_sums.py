"""Sums of a step's named metrics over a logging interval, kept on the device as one vector."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor


class IntervalSums:
    """The running sums of named 0-d metrics (the codebooks' per-layer figures) over the batches of one logging
    interval, and the interval's batch count, as one fp32 vector ``(len(names),)`` on the metrics' device.

    A step adds all its metrics in one stack and one add, and a skipped step drops the interval in one ``where``:
    a few launches per step on a GPU, not a few per metric (a 48-layer model logs about 200). Nothing is read on
    the host until :meth:`means`. A step whose names differ from the interval's so far (a metric that appears or
    stops) is added name by name.
    """

    def __init__(self) -> None:
        self.names: list[str] = []
        self.total: Tensor | None = None  # (len(names),) fp32
        self.batches: Tensor | int = 0

    def add(self, values: Mapping[str, Tensor]) -> None:
        """Add one batch's ``values`` (0-d tensors, any float dtype) to the sums."""
        if not values:
            return
        names = list(values)
        stacked = torch.stack([values[name].detach() for name in names]).float()
        if self.total is None or names == self.names:
            # a checkpoint's sums load on the host: moved on their first add (no copy once on the device)
            total = stacked if self.total is None else self.total.to(stacked.device) + stacked
            self.names, self.total = names, total
        else:
            merged = self.sums()
            for name, value in zip(names, stacked.unbind(), strict=True):
                merged[name] = merged[name] + value if name in merged else value
            self.load(merged, self.batches)
        self.batches = self.batches + 1

    def keep_if(self, finite: Tensor) -> None:
        """Keep the interval so far where ``finite`` (a 0-d bool on the device), else start it again: a skipped
        step's metrics, and those before it in the interval, are dropped as if none had been gathered."""
        if self.total is not None:
            self.total = torch.where(finite, self.total.to(finite.device), 0.0)
        self.batches = torch.where(finite, self.batches, 0)

    def means(self) -> dict[str, float]:
        """Each metric's mean over the interval's batches (one read of the device); the interval starts again."""
        if self.total is None:
            return {}
        batches = torch.as_tensor(self.batches, dtype=self.total.dtype, device=self.total.device)
        *totals, n = torch.cat([self.total, batches.reshape(1)]).tolist()
        means = {name: total / max(1.0, n) for name, total in zip(self.names, totals, strict=True)}
        self.load({}, 0)
        return means

    def sums(self) -> dict[str, Tensor]:
        """The sums by name (what a checkpoint stores)."""
        return {} if self.total is None else dict(zip(self.names, self.total.unbind(), strict=True))

    def load(self, sums: Mapping[str, Tensor], batches: Tensor | int) -> None:
        """Set the sums by name and the batch count (a checkpoint's)."""
        self.names = list(sums)
        self.total = torch.stack([torch.as_tensor(s).float() for s in sums.values()]) if sums else None
        self.batches = batches


__all__ = ["IntervalSums"]
