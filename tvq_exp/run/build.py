"""Step 4 of a run: build what it needs from a validated config: the Lightning module (also a checkpoint's, for
``eval.py`` and ``sample.py``: :func:`load_checkpoint`), the trainer with its callbacks and loggers, ``init_from``'s
weights. Every config reaching :func:`hydra.utils.instantiate` here was composed from the tree and validated
(a stored run only through :mod:`tvq_exp.run.stored`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from hydra.utils import get_class, instantiate
from lightning.pytorch.callbacks import Callback, ProgressBar
from lightning.pytorch.loggers import Logger
from omegaconf import DictConfig, OmegaConf

from tvq_exp.models.decoder import Decoder
from tvq_exp.models.dense_to_vq import init_from_dense
from tvq_exp.models.legacy import upgrade_checkpoint
from tvq_exp.models.module import AutoregressiveLitModule
from tvq_exp.run.checkpoints import AtomicCheckpointIO, gather_checkpoint, read_weights
from tvq_exp.run.loggers import ResumePoint, continue_history, resume_options
from tvq_exp.run.stored import stored_run
from tvq_exp.run.validation import ConfigError, check_parts, data_nodes, located, model_nodes, module_nodes


def set_torch_threads(cfg: DictConfig) -> None:
    """Apply the command's ``torch_threads`` (``null``: torch's default; 1 is fastest on a busy machine)."""
    threads = cfg.get("torch_threads")
    if threads is None:
        return
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ConfigError("torch_threads", threads, "must be a positive integer or null (torch's default)")
    torch.set_num_threads(threads)


def to_dict(cfg: DictConfig) -> dict[str, Any]:
    """The fully resolved config as plain containers."""
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]


def build_module(config: dict[str, Any], model: Decoder | None = None) -> AutoregressiveLitModule:
    """Instantiate the decoder (unless ``model`` is the one already built from ``config["model"]``) and its
    :class:`AutoregressiveLitModule` from a resolved run config."""
    model = instantiate(config["model"]) if model is None else model
    options = {k: v for k, v in config["module"].items() if k != "_target_"}
    return get_class(config["module"]["_target_"])(model=model, run_config=config, **options)


def build_trainer(cfg: DictConfig, callbacks: list[Callback], resumed: ResumePoint | None) -> Any:
    """The ``lightning.pytorch.Trainer`` of ``cfg.trainer`` (the tree's and the command line's, never a stored
    run's) with ``cfg.callbacks`` then ``callbacks``, ``cfg.logger`` continuing the history at ``resumed``
    (:func:`build_loggers`) and checkpoints written atomically (:class:`~tvq_exp.run.checkpoints.AtomicCheckpointIO`)."""
    return instantiate(
        cfg.trainer,
        callbacks=[*build_callbacks(cfg), *callbacks],
        logger=build_loggers(cfg, resumed) or False,
        plugins=[AtomicCheckpointIO()],
    )


def build_callbacks(cfg: DictConfig) -> list[Callback]:
    """Callbacks from ``cfg.callbacks`` (progress bars dropped when ``trainer.enable_progress_bar`` is off)."""
    callbacks = [instantiate(c) for c in (cfg.get("callbacks") or {}).values() if c is not None]
    if not cfg.trainer.get("enable_progress_bar", True):
        callbacks = [c for c in callbacks if not isinstance(c, ProgressBar)]
    return callbacks


def build_loggers(cfg: DictConfig, resumed: ResumePoint | None = None) -> list[Logger]:
    """Loggers from ``cfg.logger`` (empty: logging off); resuming at ``resumed``, each continues the run's history
    as it was when the checkpoint was written (:class:`tvq_exp.run.loggers.ResumePoint`)."""
    nodes = [c for c in (cfg.get("logger") or {}).values() if c is not None]
    loggers = [instantiate(c, **resume_options(get_class(c._target_), resumed)) for c in nodes]
    for logger in loggers:
        continue_history(logger, resumed)
    return loggers


def init_from_checkpoint(
    module: AutoregressiveLitModule, path: str, batches: Iterable[Any], count: int
) -> None:
    """``init_from``: the dense weights at ``path`` (read ``weights_only``) into ``module``'s model, a VQ model's
    codebooks k-means-initialised over ``count`` of ``batches``; a checkpoint that does not fit is refused on
    ``init_from``."""
    try:
        init_from_dense(module.model, read_weights(path), batches, count)
    except ValueError as error:
        raise ConfigError("init_from", path, str(error)) from None


def load_checkpoint(
    path: str | Path, model_options: Mapping[str, Any] | None = None
) -> tuple[AutoregressiveLitModule, dict[str, Any], dict[str, Any]]:
    """Rebuild the module stored at ``path`` -> ``(module, stored run, raw checkpoint)`` (weights loaded): the
    checkpoint read by the safe loader, its stored run checked as data and rebuilt from the tree
    (:func:`~tvq_exp.run.stored.stored_run`), ``model_options`` merged into its model (e.g. ``{"attention":
    {"use_cache": False}}``: the same weights evaluated without the cache), validated
    (:func:`~tvq_exp.run.validation.check_parts`), then built."""
    checkpoint = gather_checkpoint(path)
    config = stored_run(checkpoint["hyper_parameters"]["run_config"], f"checkpoint {path}")
    parts = OmegaConf.create(config)
    if model_options:
        parts.model = OmegaConf.merge(parts.model, OmegaConf.create(dict(model_options)))
    check_parts(parts)
    config = OmegaConf.to_container(parts, resolve=True)  # type: ignore[assignment]
    bad = non_finite(checkpoint["state_dict"])
    if bad:
        raise ConfigError(
            "ckpt_path", str(path), f"holds non-finite weights ({', '.join(bad[:3])}{', ...' if len(bad) > 3 else ''}): "
            "the run diverged; use an earlier checkpoint",
        )  # fmt: skip
    with located(model_nodes(parts.model) + module_nodes(parts.module)):
        module = build_module(config)
    upgrade_checkpoint(checkpoint, module)
    module.load_state_dict(checkpoint["state_dict"])
    return module, config, checkpoint


def build_data(data: Mapping[str, Any]) -> Any:
    """The data module of a validated data config (a stored run's, :func:`load_checkpoint`), its constructors'
    rules between options refused on their key."""
    node = OmegaConf.create(dict(data))
    with located(data_nodes(node)):
        return instantiate(node)


def non_finite(state_dict: Mapping[str, Any]) -> list[str]:
    """The names of the floating-point tensors of ``state_dict`` holding a NaN or an infinity."""
    return [
        name for name, value in state_dict.items()
        if torch.is_tensor(value) and value.is_floating_point() and not bool(value.isfinite().all())
    ]  # fmt: skip


__all__ = [
    "build_callbacks", "build_data", "build_loggers", "build_module", "build_trainer", "init_from_checkpoint",
    "load_checkpoint", "non_finite", "to_dict",
]  # fmt: skip
