"""Shared by the MQAR diagnosis probes: the composed ``recall_cpu`` model (optionally a checkpoint's weights)
and its data."""

from __future__ import annotations

from pathlib import Path

import hydra
import torch
from hydra import compose, initialize_config_dir
from lightning import LightningDataModule
from torch import nn

import tvq_exp.resolvers  # noqa: F401  (registers the tvq.* interpolations)
from tvq_exp.run.checkpoints import read_weights

CONF = Path(__file__).resolve().parents[2] / "conf"


def recall_model(
    overrides: list[str], checkpoint: str | None = None, experiment: str = "recall_cpu"
) -> tuple[nn.Module, LightningDataModule]:
    """The decoder and the data module of ``experiment`` (MQAR's ``recall_cpu`` unless named) plus ``overrides``: a
    seeded initialisation (``torch.manual_seed(1)``) or a training checkpoint's weights (read by the safe loader:
    tensors and plain data only, :func:`tvq_exp.run.checkpoints.read_weights`)."""
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        cfg = compose("train", overrides=[f"experiment={experiment}", *overrides])
        torch.manual_seed(1)
        model, data = hydra.utils.instantiate(cfg.model), hydra.utils.instantiate(cfg.data)
    if checkpoint is not None:
        loaded = read_weights(checkpoint)
        weights = loaded.get("state_dict", loaded)
        model.load_state_dict({k[6:]: v for k, v in weights.items() if k.startswith("model.")}, strict=False)
    return model, data
