"""Text samples in TensorBoard after each validation."""

from __future__ import annotations

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from tvq_exp.batch import DataKind
from tvq_exp.callbacks.final_hparams import tensorboard_loggers
from tvq_exp.callbacks.numerics_guard import validation_diverged
from tvq_exp.models.generation import generate
from tvq_exp.models.sharding import is_sharded

TEXT_VOCAB = 256


class TextSamples(Callback):
    """After each validation during ``fit``, log ``num_bytes`` sampled after ``prompt`` (text models, rank 0)
    as TensorBoard text ``samples/text``.

    Args:
        prompt: the text to continue.
        num_bytes: bytes generated per sample.
        temperature, top_k: sampling settings (see :func:`tvq_exp.models.generation.generate`).
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
            or getattr(getattr(trainer, "datamodule", None), "kind", None) is not DataKind.TEXT
            or validation_diverged(trainer)
        ):
            return  # nothing to show (a diverged model has no distribution to sample)
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
                temperature=self.temperature,
                top_k=self.top_k,
                generator=generator,
                vocab_limit=TEXT_VOCAB,
            )
        model.train(was_training)
        return (self.prompt + bytes(tokens[0].tolist())).decode("utf-8", errors="replace")

    def log_sample(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Generate and log one sample (rank 0; a sharded model generates on every rank, since each of its
        forwards gathers the parameters from all of them)."""
        loggers = tensorboard_loggers(trainer)
        if not loggers or not (trainer.is_global_zero or is_sharded(pl_module.model)):
            return
        text = self.sample(pl_module)
        if not trainer.is_global_zero:
            return
        for logger in loggers:
            logger.experiment.add_text("samples/text", f"```\n{text}\n```", global_step=trainer.global_step)
