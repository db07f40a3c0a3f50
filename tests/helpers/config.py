"""The config tree as the commands compose it, for the tests."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

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


__all__ = ["compose_config", "data_preset"]
