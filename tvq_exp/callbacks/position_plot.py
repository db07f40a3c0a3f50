"""Bits per token against position (since the last state reset) as a TensorBoard figure after each validation."""

from __future__ import annotations

import lightning as L
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from tvq_exp.batch import DataKind
from tvq_exp.plots import position_figure


class PositionPlot(Callback):
    """After each validation during ``fit`` (rank 0), draw the module's ``eval_results["val"]["position_buckets"]``
    (see :class:`~tvq_exp.models.metrics.PositionBits`) as the TensorBoard figure ``val/bpb_by_position``.
    The numbers themselves are the scalars ``val/bpb_pos/<start>-<end>``."""

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != "fit":
            return
        self.draw(trainer, pl_module)

    @rank_zero_only
    def draw(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Add the figure to every TensorBoard logger."""
        buckets = getattr(pl_module, "eval_results", {}).get("val", {}).get("position_buckets")
        loggers = [logger for logger in trainer.loggers if isinstance(logger, TensorBoardLogger)]
        if not buckets or not loggers:
            return
        unit = (
            "bits/dim"
            if getattr(getattr(trainer, "datamodule", None), "kind", None) is DataKind.IMAGE
            else "bits/byte"
        )
        figure = position_figure({f"step {trainer.global_step}": buckets}, unit)
        for logger in loggers:
            logger.experiment.add_figure("val/bpb_by_position", figure, global_step=trainer.global_step)


__all__ = ["PositionPlot"]
