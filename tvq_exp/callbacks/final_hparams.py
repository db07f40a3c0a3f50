"""TensorBoard's HParams tab, and its equivalent in every other logger, with each run's real final metrics.

At the end of ``fit``, :class:`FinalHParams` logs the run's flattened config (the global batch, and the
size of the model's recurrent inference state at the data's context length) with
``final/*`` metrics (last and best validation, last training loss, steps, training time), so a sweep
can be sorted in TensorBoard's HParams tab (needs the logger's ``default_hp_metric: false``), W&B's runs table
(config + summary), MLflow's runs table (params + metrics) or the CSV logger's ``hparams.yaml`` + last
``metrics.csv`` row.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from tvq_exp.callbacks.global_batch import trainer_global_batch

HPARAM_SECTIONS = ("model", "data", "module", "trainer", "seed", "tags")
FINAL_SCALARS = {"val/bpb": "final/val_bpb", "val/loss": "final/val_loss", "train/loss": "final/train_loss"}


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; Hydra's ``_target_``/``_partial_`` keys dropped, lists as text."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        if str(key).startswith("_"):
            continue
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = str(value) if isinstance(value, (list, tuple)) or value is None else value
    return flat


def run_hparams(pl_module: L.LightningModule) -> dict[str, Any]:
    """The hyper-parameters shown in the HParams tab: the sections ``HPARAM_SECTIONS`` of the resolved run
    config the module stores (``run_config``), flattened."""
    hparams = pl_module.hparams
    config = hparams.get("run_config") or hparams.get("config") or {}
    return flatten({key: config[key] for key in HPARAM_SECTIONS if key in config})


def final_metrics(trainer: L.Trainer, train_time_s: float) -> dict[str, float]:
    """``final/{val_bpb,val_loss,best_val_bpb,train_loss,global_step,train_time_s}`` (those that exist)."""
    metrics = {
        final: float(trainer.callback_metrics[name])
        for name, final in FINAL_SCALARS.items()
        if name in trainer.callback_metrics
    }
    checkpoint = trainer.checkpoint_callback
    if isinstance(checkpoint, ModelCheckpoint) and checkpoint.best_model_score is not None:
        metrics["final/best_val_bpb"] = float(checkpoint.best_model_score)
    metrics["final/global_step"] = float(trainer.global_step)
    metrics["final/train_time_s"] = train_time_s
    return metrics


def state_size(trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, int]:
    """``{"state_floats_per_layer": n, "state_context": T}``: the recurrent inference state per layer and
    sequence after the data's context length ``T`` (empty when the model or the data cannot tell)."""
    model, data = getattr(pl_module, "model", None), getattr(trainer, "datamodule", None)
    context = getattr(data, "context_len", None)
    if context is None or not hasattr(model, "state_floats"):
        return {}
    return {"state_floats_per_layer": int(model.state_floats(int(context))), "state_context": int(context)}


def tensorboard_loggers(trainer: L.Trainer) -> list[TensorBoardLogger]:
    """The trainer's TensorBoard loggers."""
    return [logger for logger in trainer.loggers if isinstance(logger, TensorBoardLogger)]


class FinalHParams(Callback):
    """Log the run's hyper-parameters with its real final metrics to every logger (module docstring)."""

    def __init__(self) -> None:
        self._start = 0.0

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start = time.perf_counter()

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.log_final(trainer, pl_module)

    @rank_zero_only
    def log_final(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Write the HParams summary (rank 0)."""
        if trainer.sanity_checking or not trainer.loggers:
            return
        metrics = final_metrics(trainer, time.perf_counter() - self._start)
        params = run_hparams(pl_module)
        if "data.batch_size" in params:
            params["global_batch_size"] = trainer_global_batch(trainer, params["data.batch_size"])
        params |= state_size(trainer, pl_module)
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger):
                logger.log_hyperparams(params, metrics)
                logger.experiment.flush()
            else:  # W&B, MLflow, CSV: the config as hyper-parameters, the final metrics at the last step
                logger.log_hyperparams(params)
                logger.log_metrics(metrics, step=trainer.global_step)
                logger.save()


__all__ = ["FinalHParams", "final_metrics", "flatten", "run_hparams", "state_size", "tensorboard_loggers"]
