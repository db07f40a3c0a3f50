"""The config tree as the commands compose it, for the tests."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf

from tests.helpers.paths import CONF


def compose_config(name: str, overrides: Sequence[str] = (), config_dir: Path = CONF) -> DictConfig:
    """``<config_dir>/<name>.yaml`` (``conf/`` by default) composed by Hydra with ``overrides``."""
    with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
        return compose(name, overrides=list(overrides))


def data_preset(name: str) -> DictConfig:
    """The data preset ``conf/data/<name>.yaml`` with its defaults list applied (``conf/data/base/``), editable."""
    cfg = compose_config(name, config_dir=CONF / "data")
    OmegaConf.set_struct(cfg, False)
    return cfg


def train_run(overrides: Sequence[str], output_dir: Path) -> dict[str, Any]:
    """``python train.py OVERRIDES`` run in this process, its run dir ``output_dir``: the training summary."""
    from tvq_exp.run.train import train  # noqa: PLC0415 - Lightning is imported only where a test trains

    overrides = [*overrides, f"paths.output_dir={output_dir}"]
    return train(compose_config("train", overrides), overrides)


__all__ = ["compose_config", "data_preset", "train_run"]
