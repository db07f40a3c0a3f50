"""Resuming: the config of a resumed run, the run options' checks, and ``resume=auto``'s choice of checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from tvq_exp.callbacks.checkpoint import CHECKPOINT_DIR
from tvq_exp.console import say
from tvq_exp.run.checkpoints import finished_summary, newest_good_checkpoint
from tvq_exp.run.validation import ConfigError


def resume_config(cfg: DictConfig, stored: dict[str, Any]) -> DictConfig:
    """Config for resuming: ``model``, ``data`` and ``module`` from the checkpoint's run (they must match
    the weights, optimiser and sampler state); everything else, and ``module.max_steps``, from ``cfg``."""
    cfg = cfg.copy()
    OmegaConf.set_struct(cfg, False)
    for key in ("model", "data", "module"):
        cfg[key] = OmegaConf.create(stored[key])
    cfg.module.max_steps = cfg.trainer.max_steps
    return cfg


def check_run_options(cfg: DictConfig) -> None:
    """Check ``resume``, ``run_name``, ``ckpt_path`` and ``guard`` (see docs/reliability.md)."""
    resume = cfg.get("resume")
    if resume not in (None, "auto"):
        raise ConfigError("resume", resume, "must be null or auto")
    if resume == "auto" and not cfg.get("run_name"):
        raise ConfigError(
            "resume", resume, "needs run_name=<name>: the fixed run directory a relaunch finds again"
        )
    if resume == "auto" and cfg.get("ckpt_path"):
        raise ConfigError("ckpt_path", cfg.ckpt_path, "set either ckpt_path or resume=auto, not both")
    bad_steps = cfg.guard.max_bad_steps
    if not isinstance(bad_steps, int) or isinstance(bad_steps, bool) or bad_steps < 1:
        raise ConfigError("guard.max_bad_steps", bad_steps, "must be a positive integer")


def auto_resume(cfg: DictConfig) -> DictConfig | dict[str, Any]:
    """``resume=auto``: the summary of a finished run (skip it), else ``cfg`` with ``ckpt_path`` set to the
    newest good checkpoint of the run directory (unchanged when it has none yet)."""
    run_dir = Path(cfg.paths.output_dir)
    summary = finished_summary(run_dir)
    if summary is not None and summary["global_step"] >= cfg.trainer.max_steps:
        say(f"run dir {run_dir}: finished at step {summary['global_step']}; skipped (resume=auto)")
        return summary
    checkpoint, refused = newest_good_checkpoint(run_dir / CHECKPOINT_DIR)
    for reason in refused:
        say(f"skipped: {reason}")
    if checkpoint is None:
        say(f"run dir {run_dir}: no checkpoint yet, starting from scratch (resume=auto)")
        return cfg
    say(f"resuming from {checkpoint} (resume=auto)")
    cfg = cfg.copy()
    cfg.ckpt_path = str(checkpoint)
    return cfg


__all__ = ["auto_resume", "check_run_options", "resume_config"]
