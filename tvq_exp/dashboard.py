"""TensorBoard dashboard callbacks: the HParams tab with each run's real final metrics, and text samples.

Scalar groups come from the module and :class:`tvq_exp.callbacks.Throughput` (``train/``, ``val/``,
``codebook/layerN/``, ``throughput/``, ``lr/``). These callbacks add:

- :class:`FinalHParams`: at the end of ``fit``, the run's flattened config (and the global batch) with
  ``final/*`` metrics (last and best validation, last training loss, steps, training time), so a sweep
  can be sorted in the HParams tab. Needs the logger's ``default_hp_metric: false`` (no ``hp_metric``).
- :class:`TextSamples`: after each validation, a short continuation of a prompt as TensorBoard text.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from tvq_exp.distributed import trainer_global_batch
from tvq_exp.sampling import generate

HPARAM_SECTIONS = ("model", "data", "module", "trainer", "seed")
FINAL_SCALARS = {"val/bpb": "final/val_bpb", "val/loss": "final/val_loss", "train/loss": "final/train_loss"}
TEXT_VOCAB = 256


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


def tensorboard_loggers(trainer: L.Trainer) -> list[TensorBoardLogger]:
    """The trainer's TensorBoard loggers."""
    return [logger for logger in trainer.loggers if isinstance(logger, TensorBoardLogger)]


class FinalHParams(Callback):
    """Log the run's hyper-parameters with its real final metrics to TensorBoard's HParams tab."""

    def __init__(self) -> None:
        self._start = 0.0

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start = time.perf_counter()

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.log_final(trainer, pl_module)

    @rank_zero_only
    def log_final(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Write the HParams summary (rank 0)."""
        if trainer.sanity_checking or not tensorboard_loggers(trainer):
            return
        metrics = final_metrics(trainer, time.perf_counter() - self._start)
        params = run_hparams(pl_module)
        if "data.batch_size" in params:
            params["global_batch_size"] = trainer_global_batch(trainer, params["data.batch_size"])
        for logger in tensorboard_loggers(trainer):
            logger.log_hyperparams(params, metrics)
            logger.experiment.flush()


class TextSamples(Callback):
    """After each validation during ``fit``, log ``num_bytes`` sampled after ``prompt`` (text models, rank 0)
    as TensorBoard text ``samples/text``.

    Args:
        prompt: the text to continue.
        num_bytes: bytes generated per sample.
        temperature, top_k: sampling settings (see :func:`tvq_exp.sampling.generate`).
        seed: the sampling generator's seed (the same at every validation, so samples are comparable).
    """

    def __init__(
        self,
        prompt: str = "The ",
        num_bytes: int = 128,
        temperature: float = 0.8,
        top_k: int | None = None,
        seed: int = 0,
    ) -> None:
        self.prompt = prompt.encode("utf-8") or b"\n"
        self.num_bytes, self.temperature, self.top_k, self.seed = num_bytes, temperature, top_k, seed

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if (
            trainer.sanity_checking
            or trainer.state.fn != "fit"
            or getattr(pl_module, "kind", "text") != "text"
        ):
            return
        self.log_sample(trainer, pl_module)

    def sample(self, pl_module: L.LightningModule) -> str:
        """One continuation of the prompt, decoded as UTF-8 (invalid bytes replaced)."""
        model = pl_module.model
        was_training = model.training
        device = pl_module.device
        prompt = torch.tensor([list(self.prompt)], device=device)
        generator = torch.Generator(device=device).manual_seed(self.seed)
        with torch.no_grad():
            tokens = generate(
                model,
                prompt,
                self.num_bytes,
                self.temperature,
                self.top_k,
                generator=generator,
                vocab_limit=TEXT_VOCAB,
            )
        model.train(was_training)
        return (self.prompt + bytes(tokens[0].tolist())).decode("utf-8", errors="replace")

    @rank_zero_only
    def log_sample(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Generate and log one sample (rank 0)."""
        loggers = tensorboard_loggers(trainer)
        if not loggers:
            return
        text = self.sample(pl_module)
        for logger in loggers:
            logger.experiment.add_text("samples/text", f"```\n{text}\n```", global_step=trainer.global_step)


__all__ = ["FinalHParams", "TextSamples", "final_metrics", "flatten", "run_hparams"]
