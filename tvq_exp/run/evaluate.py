"""``eval.py``: a checkpoint's bits per byte (or dim) over a whole split, written as JSON; the command's options
are checked before Lightning is imported (a bad value is refused fast)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from tvq_exp.run.validation import Command, ConfigError, check, check_nodes, data_nodes, interpolation_errors


def default_eval_output(
    ckpt_path: str | Path, split: str, protocol: str, limit_batches: int | float | None = None
) -> Path:
    """``<ckpt dir>/eval-<ckpt name>-<split>-<protocol>.json``; a partial evaluation (``limit_batches``) ends
    in ``-limit<N>`` so it never overwrites, or passes for, the whole split's result."""
    path = Path(ckpt_path)
    limit = f"-limit{limit_batches:g}" if limit_batches else ""
    return path.with_name(f"eval-{path.stem}-{split}-{protocol}{limit}.json")


def eval_data_config(cfg: DictConfig, stored: dict[str, Any]) -> DictConfig:
    """The run's data config with the evaluation's overrides (root, streams, protocol)."""
    data_cfg = OmegaConf.create(stored)
    if cfg.get("data_root"):
        data_cfg.root = cfg.data_root
    if cfg.get("eval_batch_size"):
        data_cfg.eval_batch_size = cfg.eval_batch_size
    if cfg.get("seq_len"):
        data_cfg.seq_len = cfg.seq_len
    protocol = cfg.get("protocol")
    if cfg.get("carry_state"):
        if protocol not in (None, "split"):
            raise ConfigError("carry_state", True, f"is protocol=split; it contradicts protocol={protocol}")
        protocol = "split"
    if protocol is not None or cfg.get("sequence_len") is not None:
        if "eval_protocol" not in data_cfg:
            raise ConfigError(
                "protocol", protocol, f"only text data has evaluation protocols ({stored.get('_target_')})"
            )
        data_cfg.eval_protocol = protocol or data_cfg.eval_protocol
        data_cfg.sequence_len = cfg.get("sequence_len") or data_cfg.get("sequence_len")
    return data_cfg


def evaluate(cfg: DictConfig) -> dict[str, Any]:
    """Evaluate ``cfg.ckpt_path`` over the whole ``cfg.split`` (``val`` | ``test``; its first
    ``cfg.limit_batches`` batches when set); print and write JSON.

    Returns ``{"bpb", "loss", "tokens", ["bpd"], "position_buckets", ["accuracy"], "split", "protocol",
    "checkpoint", "global_step", "limit_batches", "state_floats_per_layer", "state_context", ["codebook"]}``; the
    figure of bits against position is written beside the JSON. VQ models add ``"codebook": {"layerN":
    {"perplexity", "dead_fraction", "quant_error", "kmeans_error", "regret", "kmeans_perplexity",
    "codebook_size"}}`` over the split's
    keys (see :class:`~tvq_exp.callbacks.codebook_health.CodebookHealth`, with its default settings).
    """
    check(cfg, Command.EVAL)
    # Lightning and what imports it only for a config that passed (fast refusal)
    import lightning as L  # noqa: PLC0415

    from tvq_exp.callbacks.codebook_health import CodebookHealth  # noqa: PLC0415
    from tvq_exp.callbacks.data_fingerprint import DataFingerprint  # noqa: PLC0415
    from tvq_exp.callbacks.final_hparams import state_size  # noqa: PLC0415
    from tvq_exp.callbacks.numerics_guard import NumericsError  # noqa: PLC0415
    from tvq_exp.console import quiet, say  # noqa: PLC0415
    from tvq_exp.files import atomic_write, check_writable, write_text  # noqa: PLC0415
    from tvq_exp.plots import position_figure, save_figure  # noqa: PLC0415
    from tvq_exp.run.build import build_data, load_checkpoint, set_torch_threads  # noqa: PLC0415

    quiet()
    set_torch_threads(cfg)
    if cfg.split not in ("val", "test"):
        raise ConfigError("split", cfg.split, "must be val or test")
    module, config, checkpoint = load_checkpoint(cfg.ckpt_path, cfg.get("model_options"))
    data_cfg = eval_data_config(cfg, config["data"])
    with interpolation_errors():
        # the stored data with this command's changes, checked as train.py checks it
        check_nodes(data_nodes(data_cfg))
    datamodule = build_data(data_cfg)
    protocol = data_cfg.get("eval_protocol", "segment")
    precision = cfg.precision or (
        "bf16-mixed" if torch.cuda.is_available() and cfg.accelerator != "cpu" else "32-true"
    )
    stored = (checkpoint.get("callbacks") or {}).get(DataFingerprint.__name__, {}).get("fingerprint")
    health = CodebookHealth()
    trainer = L.Trainer(
        accelerator=cfg.accelerator,
        callbacks=[health, DataFingerprint(cfg.allow_data_change, expected=stored)],
        devices=1,
        precision=precision,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=bool(cfg.progress_bar),
        limit_val_batches=cfg.limit_batches or 1.0,
        limit_test_batches=cfg.limit_batches or 1.0,
    )
    output = (
        Path(cfg.output)
        if cfg.get("output")
        else default_eval_output(cfg.ckpt_path, cfg.split, protocol, cfg.get("limit_batches"))
    )
    check_writable(output.parent)  # a read-only or full folder stops now, not after the evaluation
    run = trainer.validate if cfg.split == "val" else trainer.test
    run(module, datamodule=datamodule, verbose=False)
    result = {
        **module.eval_results[cfg.split],
        "split": cfg.split,
        "protocol": protocol,
        "checkpoint": str(Path(cfg.ckpt_path).resolve()),
        "global_step": int(checkpoint.get("global_step", 0)),
        "limit_batches": cfg.get("limit_batches"),  # null: the whole split
        **state_size(trainer, module),
        **({"codebook": health.results} if health.results else {}),
    }
    write_text(output, output.parent, json.dumps(result, indent=2) + "\n")
    unit = "bits/dim" if module.kind == "image" else "bits/byte"
    label = f"{Path(cfg.ckpt_path).stem}, {cfg.split}, {protocol}"
    with atomic_write(output.with_suffix(".png"), output.parent) as png:
        save_figure(position_figure({label: result["position_buckets"]}, unit), png)
    if not math.isfinite(result["bpb"]):
        raise NumericsError(
            f"eval of {cfg.ckpt_path}: {result['bpb']} bits per {'dim' if module.kind == 'image' else 'byte'} "
            f"over {cfg.split} (a non-finite loss; written to {output}): check the weights and the data"
        )
    accuracy = f", accuracy {result['accuracy']['accuracy']:.4f}" if "accuracy" in result else ""
    say(
        f"{cfg.split}: {result['bpb']:.4f} bits/{'dim' if module.kind == 'image' else 'byte'}, "
        f"loss {result['loss']:.4f} nats{accuracy}, {result['tokens']} tokens -> {output}"
    )
    if health.results:
        layers = (
            f"{name} {r['perplexity']:.1f}/{r['codebook_size']} "
            f"(k-means {r['kmeans_perplexity']:.1f}, regret {r['regret']:.2f})"
            for name, r in health.results.items()
        )
        say(f"codebook usage: {', '.join(layers)}")
    return result


__all__ = ["default_eval_output", "evaluate"]
