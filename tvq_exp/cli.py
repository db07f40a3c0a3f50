"""What ``train.py``, ``eval.py`` and ``sample.py`` do, as functions of a composed Hydra config.

Importing this module registers the OmegaConf resolvers the config tree uses:
``${tvq.uid:}`` (a short random id, unique per config), ``${tvq.eq:a,b}``, ``${tvq.or:a,b}`` (``a`` unless it is
null or empty, else ``b``) and ``${tvq.precision:}`` (``bf16-mixed`` where CUDA is available, else ``32-true``).
"""

from __future__ import annotations

import json
import logging
import secrets
import sys
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import torch
from hydra.utils import get_class, instantiate
from lightning.pytorch.callbacks import Callback, ModelCheckpoint, ProgressBar
from lightning.pytorch.loggers import Logger
from lightning.pytorch.utilities.exceptions import SIGTERMException
from lightning.pytorch.utilities.rank_zero import rank_zero_only
from omegaconf import DictConfig, OmegaConf

from tvq_exp.checkpointing import (
    CHECKPOINT_DIR,
    AtomicCheckpointIO,
    RngState,
    finished_summary,
    mark_finished,
    newest_good_checkpoint,
    read_checkpoint,
)
from tvq_exp.config import ConfigError, validate
from tvq_exp.convert import init_from_dense
from tvq_exp.guard import NumericsError, NumericsGuard
from tvq_exp.images import sample_checkpoint_grid
from tvq_exp.lit import LanguageModel
from tvq_exp.preemption import Preemption
from tvq_exp.sampling import generate

TEXT_VOCAB = 256
QUIET_LOGGERS = (
    "lightning.pytorch.utilities.rank_zero",
    "lightning.pytorch.accelerators.cuda",
    "lightning.fabric.utilities.seed",
    "lightning.fabric.utilities.rank_zero",
    "lightning.fabric.utilities.distributed",
)
NOISY_WARNINGS = (
    r".*does not have many workers.*",
    r".*smaller than the logging interval.*",
    r".*exists and is not empty.*",
    r".*`isinstance\(treespec, LeafSpec\)` is deprecated.*",
)


def _register_resolvers() -> None:
    resolvers = {
        "tvq.uid": (lambda: secrets.token_hex(3), True),
        "tvq.eq": (lambda a, b: str(a) == str(b), False),
        "tvq.or": (lambda a, b: b if a in (None, "") else a, False),
        "tvq.precision": (lambda: "bf16-mixed" if torch.cuda.is_available() else "32-true", False),
    }
    for name, (fn, cache) in resolvers.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn, use_cache=cache)


_register_resolvers()


def quiet() -> None:
    """Silence Lightning's start-up chatter (accelerator lines, tips, seeds) and noise warnings."""
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    for pattern in NOISY_WARNINGS:
        warnings.filterwarnings("ignore", message=pattern)


@rank_zero_only
def say(message: str) -> None:
    """Print one line on rank 0."""
    print(message, file=sys.stdout, flush=True)


# --------------------------------------------------------------------------------------------- building


def to_dict(cfg: DictConfig) -> dict[str, Any]:
    """The fully resolved config as plain containers."""
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]


def build_module(config: dict[str, Any]) -> LanguageModel:
    """Instantiate the decoder and its :class:`LanguageModel` from a resolved run config."""
    model = instantiate(config["model"])
    options = {k: v for k, v in config["module"].items() if k != "_target_"}
    return get_class(config["module"]["_target_"])(model=model, run_config=config, **options)


def build_callbacks(cfg: DictConfig) -> list[Callback]:
    """Callbacks from ``cfg.callbacks`` (progress bars dropped when ``trainer.enable_progress_bar`` is off)."""
    callbacks = [instantiate(c) for c in (cfg.get("callbacks") or {}).values() if c is not None]
    if not cfg.trainer.get("enable_progress_bar", True):
        callbacks = [c for c in callbacks if not isinstance(c, ProgressBar)]
    return callbacks


def build_loggers(cfg: DictConfig) -> list[Logger]:
    """Loggers from ``cfg.logger`` (empty: logging off)."""
    return [instantiate(c) for c in (cfg.get("logger") or {}).values() if c is not None]


def run_config(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """The resolved run config a :class:`LanguageModel` checkpoint carries."""
    return checkpoint["hyper_parameters"]["run_config"]


def load_checkpoint(path: str | Path) -> tuple[LanguageModel, dict[str, Any], dict[str, Any]]:
    """Rebuild the module stored at ``path`` -> ``(module, run config, raw checkpoint)`` (weights loaded)."""
    checkpoint = read_checkpoint(path)
    config = run_config(checkpoint)
    module = build_module(config)
    module.load_state_dict(checkpoint["state_dict"])
    return module, config, checkpoint


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
        raise ConfigError("resume", resume, "needs run_name=<name>: the fixed run directory a relaunch finds again")
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


# --------------------------------------------------------------------------------------------- train


def train(cfg: DictConfig) -> dict[str, Any]:
    """Train (or resume with ``ckpt_path`` or ``resume=auto``) as configured.

    Writes ``config.yaml`` (resolved), logs and ``checkpoints/`` into ``cfg.paths.output_dir`` (checkpoints
    atomically, with RNG states); ``finished.json`` when the last step is reached. SIGTERM/SIGUSR1 save
    ``last.ckpt`` and return early; the numerics guard raises :class:`NumericsError` after
    ``guard.max_bad_steps`` bad steps in a row. Returns
    ``{"best_val_bpb", "best_ckpt", "last_ckpt", "global_step", "val"}``.
    """
    quiet()
    validate(cfg)
    check_run_options(cfg)
    if cfg.get("resume") == "auto":
        resumed = auto_resume(cfg)
        if not isinstance(resumed, DictConfig):
            return resumed
        cfg = resumed
    if cfg.get("ckpt_path"):
        cfg = resume_config(cfg, run_config(read_checkpoint(cfg.ckpt_path)))
        validate(cfg)
    if cfg.get("torch_threads"):
        torch.set_num_threads(cfg.torch_threads)
    L.seed_everything(cfg.seed, workers=True)
    output_dir = Path(cfg.paths.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    config = to_dict(cfg)
    OmegaConf.save(OmegaConf.create(config), output_dir / "config.yaml")

    datamodule = instantiate(cfg.data)
    module = build_module(config)
    if cfg.get("init_from") and not cfg.get("ckpt_path"):
        datamodule.prepare_data()
        datamodule.setup("fit")
        init_from_dense(module.model, cfg.init_from, datamodule.train_dataloader(), cfg.init_batches)
        say(f"initialised from {cfg.init_from} (k-means codebooks over {cfg.init_batches} batches)")

    preemption, guard = Preemption(), NumericsGuard(cfg.guard.max_bad_steps)
    trainer: L.Trainer = instantiate(
        cfg.trainer,
        callbacks=[*build_callbacks(cfg), RngState(), preemption, guard],
        logger=build_loggers(cfg) or False,
        plugins=[AtomicCheckpointIO()],
    )
    n_params = sum(p.numel() for p in module.model.parameters())
    say(f"run dir {output_dir} | {n_params / 1e6:.2f}M parameters | {cfg.trainer.max_steps} steps")
    try:
        trainer.fit(module, datamodule=datamodule, ckpt_path=cfg.get("ckpt_path"))
    except SIGTERMException:  # raised by Lightning after Preemption saved last.ckpt
        if preemption.signal_name is None:
            raise
        for logger in trainer.loggers:
            logger.finalize("interrupted")
    if guard.failure is not None:
        raise NumericsError(guard.failure)
    summary = _fit_summary(trainer, module)
    if preemption.signal_name is None and trainer.global_step >= cfg.trainer.max_steps and trainer.is_global_zero:
        mark_finished(output_dir, summary)
    return summary


def _fit_summary(trainer: L.Trainer, module: LanguageModel) -> dict[str, Any]:
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


# --------------------------------------------------------------------------------------------- eval


def default_eval_output(ckpt_path: str | Path, split: str, carry_state: bool) -> Path:
    """``<ckpt dir>/eval-<ckpt name>-<split>[-carry].json``."""
    path = Path(ckpt_path)
    return path.with_name(f"eval-{path.stem}-{split}{'-carry' if carry_state else ''}.json")


def evaluate(cfg: DictConfig) -> dict[str, Any]:
    """Evaluate ``cfg.ckpt_path`` over the whole ``cfg.split`` (``val`` | ``test``); print and write JSON.

    Returns ``{"bpb", "loss", "tokens", ["bpd"], "split", "carry_state", "checkpoint", "global_step"}``.
    """
    quiet()
    validate(cfg)
    if cfg.split not in ("val", "test"):
        raise ConfigError("split", cfg.split, "must be val or test")
    module, config, checkpoint = load_checkpoint(cfg.ckpt_path)
    module.eval_carry_state = bool(cfg.carry_state)
    data_cfg = OmegaConf.create(config["data"])
    if cfg.get("data_root"):
        data_cfg.root = cfg.data_root
    if cfg.get("eval_batch_size"):
        data_cfg.eval_batch_size = cfg.eval_batch_size
    datamodule = instantiate(data_cfg)
    precision = cfg.precision or (
        "bf16-mixed" if torch.cuda.is_available() and cfg.accelerator != "cpu" else "32-true"
    )
    trainer = L.Trainer(
        accelerator=cfg.accelerator,
        devices=1,
        precision=precision,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=bool(cfg.progress_bar),
        limit_val_batches=cfg.limit_batches or 1.0,
        limit_test_batches=cfg.limit_batches or 1.0,
    )
    run = trainer.validate if cfg.split == "val" else trainer.test
    run(module, datamodule=datamodule, verbose=False)
    result = {
        **module.eval_results[cfg.split],
        "split": cfg.split,
        "carry_state": bool(cfg.carry_state),
        "checkpoint": str(Path(cfg.ckpt_path).resolve()),
        "global_step": int(checkpoint.get("global_step", 0)),
    }
    output = (
        Path(cfg.output)
        if cfg.get("output")
        else default_eval_output(cfg.ckpt_path, cfg.split, cfg.carry_state)
    )
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(result, indent=2) + "\n")
    say(
        f"{cfg.split}: {result['bpb']:.4f} bits/{'dim' if module.kind == 'image' else 'byte'}, "
        f"loss {result['loss']:.4f} nats, {result['tokens']} tokens -> {output}"
    )
    return result


# --------------------------------------------------------------------------------------------- sample


def sample(cfg: DictConfig) -> list[bytes] | Path:
    """Continue ``cfg.prompt`` by exactly ``cfg.num_bytes`` bytes, ``cfg.num_samples`` times; print the texts.

    Returns the generated bytes of every sample (prompt excluded). For an image checkpoint, writes
    ``cfg.num_samples`` sampled images as one PNG grid instead (:func:`tvq_exp.images.sample_checkpoint_grid`)
    and returns its path.
    """
    quiet()
    validate(cfg)
    module, config, _ = load_checkpoint(cfg.ckpt_path)
    if module.kind == "image":
        path = sample_checkpoint_grid(module.model, config["data"], cfg)
        say(f"{cfg.num_samples} image samples -> {path}")
        return path
    prompt = str(cfg.prompt).encode("utf-8")
    if not prompt:
        raise ConfigError("prompt", cfg.prompt, "must hold at least one byte (e.g. prompt='\\n')")
    auto = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(auto if cfg.device == "auto" else cfg.device)
    model = module.model.to(device)
    prompt_tokens = torch.tensor(list(prompt), device=device).repeat(cfg.num_samples, 1)
    generator = torch.Generator(device=device).manual_seed(cfg.seed)
    tokens = generate(
        model,
        prompt_tokens,
        cfg.num_bytes,
        temperature=cfg.temperature,
        top_k=cfg.top_k,
        top_p=cfg.top_p,
        generator=generator,
        vocab_limit=TEXT_VOCAB,
    )
    samples = [bytes(row.tolist()) for row in tokens.cpu()]
    for i, text in enumerate(samples):
        if cfg.num_samples > 1:
            say(f"--- sample {i}")
        say((prompt + text).decode("utf-8", errors="replace"))
    if cfg.get("output"):
        Path(cfg.output).write_bytes(b"\n".join(prompt + text for text in samples))
    return samples


__all__ = ["auto_resume", "build_module", "check_run_options", "evaluate", "load_checkpoint", "quiet", "run_config", "sample", "to_dict", "train"]
