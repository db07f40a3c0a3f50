"""Resuming: the config of a resumed run, the run options' checks, and ``resume=auto``'s choice of checkpoint."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf

from tvq_exp.callbacks.checkpoint import CHECKPOINT_DIR
from tvq_exp.console import say
from tvq_exp.run.checkpoints import finished_summary, newest_good_checkpoint
from tvq_exp.run.validation import ConfigError


def relaunch_config(cfg: DictConfig, stored: dict[str, Any]) -> DictConfig:
    """Config for ``resume=auto`` (the same command launched again): ``model``, ``data`` and ``module`` from
    the checkpoint's run (they must match the weights, optimiser and sampler state); everything else, and
    ``module.max_steps``, from ``cfg``."""
    cfg = cfg.copy()
    OmegaConf.set_struct(cfg, False)
    for key in ("model", "data", "module"):
        cfg[key] = OmegaConf.create(stored[key])
    cfg.module.max_steps = cfg.trainer.max_steps
    return cfg


CURRENT = ("paths", "ckpt_path", "resume", "run_name", "init_from")  # this launch's, never the stored run's


def resume_config(cfg: DictConfig, stored: dict[str, Any], overrides: Sequence[str]) -> DictConfig:
    """Config for continuing the checkpoint's run: the stored run config (model, data, module, trainer,
    logger, callbacks, seed, ...) with this launch's explicit command-line ``overrides`` on top, taken from
    ``cfg`` (as are the top-level keys the stored config lacks: options newer than the run). Paths under the stored run dir follow ``paths.output_dir`` (the checkpoint's run dir unless
    ``run_name`` or ``paths.output_dir`` is given). ``module.max_steps`` follows an overridden
    ``trainer.max_steps`` unless it is overridden itself. An override of a group with no key of that name
    (``experiment=...``, which sets keys all over the config) is left out, and one line says so."""
    old_dir = str((stored.get("paths") or {}).get("output_dir") or "")
    merged = OmegaConf.create(_rerooted(stored, old_dir) if old_dir else stored)
    OmegaConf.set_struct(merged, False)
    for key in CURRENT:
        merged[key] = cfg.get(key)
    for key in cfg:  # options newer than the stored run (e.g. allow_data_change) take this launch's value
        if key not in merged:
            merged[key] = cfg.get(key)
    changed = set()
    for override in OverridesParser.create().parse_overrides(list(overrides)):
        path = override.key_or_group.replace("/", ".")
        if path.split(".")[0] in (*CURRENT, "hydra"):
            continue
        if override.is_delete():
            parent, _, leaf = path.rpartition(".")
            node = OmegaConf.select(merged, parent) if parent else merged
            if isinstance(node, DictConfig) and leaf in node:
                del node[leaf]
            continue
        value = OmegaConf.select(cfg, path, default=_MISSING)
        if value is _MISSING:
            say(
                f"{override.input_line}: not laid over the resumed run (it sets no single key); give keys instead"
            )
            continue
        OmegaConf.update(merged, path, value, merge=False, force_add=True)
        changed.add(path)
    if "trainer.max_steps" in changed and "module.max_steps" not in changed:
        merged.module.max_steps = merged.trainer.max_steps
    return merged


def nothing_left(cfg: DictConfig, step: int) -> dict[str, Any] | None:
    """When the checkpoint already is at ``trainer.max_steps``: say so in one line and return the run's
    summary (its ``finished.json``, else the step alone); otherwise None."""
    if step < cfg.trainer.max_steps:
        return None
    say(
        f"{cfg.ckpt_path} is at step {step}, trainer.max_steps={cfg.trainer.max_steps}: nothing to train "
        "(give trainer.max_steps=N to go on)"
    )
    empty = {"best_val_bpb": None, "best_ckpt": None, "last_ckpt": str(cfg.ckpt_path), "val": None}
    return finished_summary(Path(cfg.paths.output_dir)) or {**empty, "global_step": step}


def explicit_overrides() -> list[str]:
    """This launch's command-line overrides (``key=value``, ``group=option``, ``+key=value``, ``~key``)."""
    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []


def _rerooted(value: Any, old_dir: str) -> Any:
    """``value`` with every string at or under ``old_dir`` rewritten to follow ``${paths.output_dir}``."""
    if isinstance(value, dict):
        return {k: _rerooted(v, old_dir) if k != "paths" else v for k, v in value.items()}
    if isinstance(value, list):
        return [_rerooted(v, old_dir) for v in value]
    if isinstance(value, str) and (value == old_dir or value.startswith(old_dir + "/")):
        return "${paths.output_dir}" + value[len(old_dir) :]
    return value


_MISSING = object()


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


__all__ = [
    "auto_resume",
    "check_run_options",
    "explicit_overrides",
    "nothing_left",
    "resume_config",
]
