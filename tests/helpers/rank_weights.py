"""A callback for multi-process tests: at the end of training every rank saves its own weights and the first
batch it trained on, so a test can compare the ranks (Lightning's checkpoints hold rank 0's weights alone)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback


class RankWeights(Callback):
    """Write ``<output_dir>/weights-rank<R>.pt`` (the module's ``state_dict``, and under ``"first batch:input"`` the
    input of the first training batch) on every rank at train end.

    Args:
        output_dir: the folder (the run directory)."""

    def __init__(self, output_dir: str) -> None:
        self.output_dir = Path(output_dir)
        self.first_input: torch.Tensor | None = None

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self.first_input is None:
            self.first_input = batch["input"].detach().cpu().clone()

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.output_dir.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().cpu() for k, v in pl_module.state_dict().items()}
        if self.first_input is not None:
            state["first batch:input"] = self.first_input
        torch.save(state, self.output_dir / f"weights-rank{trainer.global_rank}.pt")


__all__ = ["RankWeights"]
