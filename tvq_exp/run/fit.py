"""Step 5 of a train run: fit a composed, validated config with Lightning (:func:`fit`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint, Timer
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities.exceptions import SIGTERMException
from omegaconf import DictConfig, OmegaConf

from tvq_exp.callbacks.data_fingerprint import DataFingerprint
from tvq_exp.callbacks.final_validation import FinalValidation
from tvq_exp.callbacks.numerics_guard import NumericsError, NumericsGuard
from tvq_exp.callbacks.preemption import Preemption
from tvq_exp.callbacks.rng_state import RngState
from tvq_exp.console import quiet, say
from tvq_exp.files import lock_run_dir, refuse_links, write_text
from tvq_exp.models.module import AutoregressiveLitModule
from tvq_exp.run.build import (
    build_module,
    build_trainer,
    init_from_checkpoint,
    set_torch_threads,
    to_dict,
)
from tvq_exp.run.checkpoints import CHECKPOINT_DIR, mark_finished, remove_stale_temporaries
from tvq_exp.run.extras import is_rank_zero, print_config
from tvq_exp.run.loggers import ResumePoint
from tvq_exp.run.resume import Start
from tvq_exp.run.run_dir import record_hydra_files
from tvq_exp.run.validation import build_run, located, module_nodes


def fit(cfg: DictConfig, start: Start) -> dict[str, Any]:
    """Train ``cfg`` (composed by :func:`tvq_exp.run.compose.compose_run` and validated: :func:`tvq_exp.run.train.train`
    does both) from ``start`` (scratch, or its checkpoint).

    Writes ``config.yaml`` (resolved), Hydra's ``.hydra/`` record, logs and ``checkpoints/`` into
    ``cfg.paths.output_dir`` (checkpoints atomically, with RNG states); ``finished.json`` when the last step is
    reached, or when a wall-clock budget (``trainer.max_time``) is spent (the run's budget is then time, not
    steps). SIGTERM/SIGUSR1 save ``last.ckpt`` and return early; the numerics guard raises :class:`NumericsError`
    after ``guard.max_bad_steps`` bad steps in a row. Returns
    ``{"best_val_bpb", "best_ckpt", "last_ckpt", "global_step", "val"}``.
    """
    quiet()
    set_torch_threads(cfg)
    L.seed_everything(cfg.seed, workers=True)
    config = to_dict(cfg)
    model, datamodule = build_run(cfg)  # the constructors' rules between options, refused with their key
    with located(module_nodes(cfg.module)):
        module = build_module(config, model)
    preemption, guard = Preemption(), NumericsGuard(cfg.guard.max_bad_steps)
    ours = [RngState(), DataFingerprint(cfg.allow_data_change), preemption, guard, FinalValidation()]
    resumed = ResumePoint(start.step, start.saved_at) if start.checkpoint is not None else None
    trainer: L.Trainer = build_trainer(cfg, ours, resumed)  # Lightning's own checks of its options
    if cfg.get("print_config", True):
        print_config(cfg)  # the whole config passed: its tree, then the run
    output_dir = Path(cfg.paths.output_dir)  # written only now: a refused config leaves nothing there
    output_dir.mkdir(parents=True, exist_ok=True)
    # held while this run writes here: a second run with this run_name refuses (the launch's other ranks write
    # into the run dir its first process holds)
    _lock = lock_run_dir(output_dir) if is_rank_zero() else None
    refuse_links(output_dir)  # a link in the run dir would send a checkpoint, config or log outside it
    for stale in remove_stale_temporaries(output_dir / CHECKPOINT_DIR):
        say(f"removed {stale}: a checkpoint save that was killed half-way")
    write_text("config.yaml", output_dir, OmegaConf.to_yaml(OmegaConf.create(config)))
    record_hydra_files(output_dir, cfg)
    if cfg.get("init_from") and start.checkpoint is None:
        datamodule.prepare_data()
        datamodule.setup("fit")
        init_from_checkpoint(module, cfg.init_from, datamodule.train_dataloader(), cfg.init_batches)
        codebooks = (
            f" (k-means codebooks over {cfg.init_batches} batches)" if module.model.quantizers() else ""
        )
        say(f"initialised from {cfg.init_from}{codebooks}")

    n_params = sum(p.numel() for p in module.model.parameters())
    say(f"run dir {output_dir} | {n_params / 1e6:.2f}M parameters | {planned_steps(cfg.trainer)}")
    try:
        trainer.fit(module, datamodule=datamodule, ckpt_path=start.checkpoint)
    except SIGTERMException:  # raised by Lightning after Preemption saved last.ckpt
        if preemption.signal_name is None:
            raise
        for logger in trainer.loggers:
            logger.finalize("interrupted")
    except SystemExit:  # Lightning's answer to Ctrl-C (SIGINT): exit 1 without a word
        if trainer.interrupted:
            raise KeyboardInterrupt from None  # tvq_exp.run.errors.run says so in one line
        raise
    _finish_runs(trainer)
    if guard.failure is not None:
        raise NumericsError(guard.failure)
    summary = _fit_summary(trainer, module)
    if (
        preemption.signal_name is None
        and (trainer.global_step >= cfg.trainer.max_steps or _time_spent(trainer))
        and trainer.is_global_zero
    ):
        mark_finished(output_dir, summary)
    return summary


def _time_spent(trainer: L.Trainer) -> bool:
    """Whether Lightning's ``max_time`` budget stopped training (its timer has no time left)."""
    remaining = [c.time_remaining() for c in trainer.callbacks if isinstance(c, Timer)]
    return any(seconds is not None and seconds <= 0 for seconds in remaining)


def _finish_runs(trainer: L.Trainer) -> None:
    """Close an open W&B run: Lightning leaves it open, and the next sweep job of this process would log into
    it (and an offline run writes its config and summary files only when closed)."""
    if any(isinstance(logger, WandbLogger) for logger in trainer.loggers):
        import wandb  # only installed where logger=wandb is used

        if wandb.run is not None:
            wandb.finish()


def _fit_summary(trainer: L.Trainer, module: AutoregressiveLitModule) -> dict[str, Any]:
    checkpoint = trainer.checkpoint_callback
    best = None
    if isinstance(checkpoint, ModelCheckpoint) and checkpoint.best_model_score is not None:
        best = float(checkpoint.best_model_score)
    return {
        "best_val_bpb": best,
        "best_ckpt": checkpoint.best_model_path if isinstance(checkpoint, ModelCheckpoint) else None,
        "last_ckpt": checkpoint.last_model_path if isinstance(checkpoint, ModelCheckpoint) else None,
        "global_step": trainer.global_step,
        "val": module.eval_results.get("val"),
    }


__all__ = ["fit"]


def planned_steps(trainer: DictConfig) -> str:
    """The steps the run will take, for its header: ``fast_dev_run`` (``true`` is 1, ``N`` is N) over ``max_steps``."""
    fast = trainer.get("fast_dev_run")
    steps = int(fast) if fast else trainer.max_steps
    return f"{steps} step{'s' * (steps != 1)}{' (fast_dev_run)' if fast else ''}"
