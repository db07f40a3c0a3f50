"""The global batch: printed at the start of ``fit`` and checked against the config's ``global_batch_size``."""

from __future__ import annotations

import lightning as L
from lightning.pytorch.callbacks import Callback

from tvq_exp.console import say


def global_batch_size(per_device: int, world_size: int, accumulation: int) -> int:
    """Sequences per optimiser step over all processes: ``per_device × world_size × accumulation``."""
    return int(per_device) * int(world_size) * int(accumulation)


def trainer_global_batch(trainer: L.Trainer, per_device: int) -> int:
    """The global batch of ``trainer`` (``world_size`` counts devices × nodes)."""
    return global_batch_size(per_device, trainer.world_size, trainer.accumulate_grad_batches)


class GlobalBatchSize(Callback):
    """Print the global batch at the start of ``fit``; check it against ``expected`` when given.

    Args:
        per_device: the data module's (per-process) batch size.
        expected: the global batch the config states (``null``: not checked).
    """

    def __init__(self, per_device: int, expected: int | None = None) -> None:
        self.per_device, self.expected = int(per_device), expected

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        actual = trainer_global_batch(trainer, self.per_device)
        if self.expected is not None and actual != int(self.expected):
            raise ValueError(
                f"global batch {actual} = data.batch_size {self.per_device} x {trainer.world_size} processes "
                f"x accumulate_grad_batches {trainer.accumulate_grad_batches}, but the config states "
                f"global_batch_size={self.expected}: change data.batch_size, trainer.devices/num_nodes or "
                "trainer.accumulate_grad_batches"
            )
        say(
            f"global batch {actual} sequences = {self.per_device} per device x {trainer.world_size} processes "
            f"x {trainer.accumulate_grad_batches} accumulation"
        )


__all__ = ["GlobalBatchSize", "global_batch_size", "trainer_global_batch"]
