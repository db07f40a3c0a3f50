"""``eval.py``: a checkpoint's bits per byte (or dim) over a whole split, written as JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import lightning as L
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from tvq_exp.console import quiet, say
from tvq_exp.run.build import load_checkpoint
from tvq_exp.run.validation import ConfigError, validate


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


__all__ = ["default_eval_output", "evaluate"]
