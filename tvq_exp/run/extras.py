"""What a train run does at its start, as the Lightning–Hydra template's ``extras``: print the composed config as
a tree (rich; ``print_config=false`` turns it off) and check the run's ``tags``.

``tags=[baseline,s512]`` labels a run: every logger records them (the ``tags`` hyper-parameter that
:class:`~tvq_exp.callbacks.final_hparams.FinalHParams` logs to TensorBoard's HParams, W&B, MLflow and CSV, and
W&B's own run tags, conf/logger/wandb.yaml)."""

from __future__ import annotations

import os
import re
import sys

from omegaconf import DictConfig, ListConfig, OmegaConf
from rich.console import Console
from rich.syntax import Syntax
from rich.tree import Tree

from tvq_exp.run.validation import ConfigError

TAG = re.compile(r"[\w.+-]+")
RANK_VARIABLES = (
    "RANK",
    "LOCAL_RANK",
    "NODE_RANK",
    "SLURM_PROCID",
)  # where launchers say which process this is (Lightning's)
# the sections in the order a reader looks for them; the rest follow in the config's order
FIRST = ("model", "codebook", "data", "module", "trainer", "logger", "callbacks")


def check_tags(cfg: DictConfig) -> list[str]:
    """``cfg.tags`` as a list of words (``[]`` when absent); anything else is a one-line :class:`ConfigError`."""
    tags = cfg.get("tags")
    if tags is None:
        return []
    words = list(tags) if isinstance(tags, ListConfig) else None
    if words is None or not all(isinstance(t, str) and TAG.fullmatch(t) for t in words):
        raise ConfigError(
            "tags", tags, "must be a list of words (letters, digits, . _ + -), e.g. tags=[baseline,s512]"
        )
    return words


def config_tree(cfg: DictConfig) -> Tree:
    """The resolved config as a rich tree: one branch per top-level node (YAML inside), the scalars in one."""
    tree = Tree("config", guide_style="dim")
    nodes = [k for k in FIRST if isinstance(cfg.get(k), DictConfig)]
    nodes += [k for k in cfg if isinstance(cfg.get(k), DictConfig) and k not in nodes and k != "hydra"]
    for key in nodes:
        text = OmegaConf.to_yaml(cfg[key], resolve=True) or "{}\n"
        tree.add(str(key)).add(Syntax(text.rstrip(), "yaml", theme="ansi_dark", background_color="default"))
    scalars = {k: cfg[k] for k in cfg if k not in nodes and k != "hydra"}
    if scalars:
        text = OmegaConf.to_yaml(OmegaConf.create(scalars), resolve=True)
        tree.add("top level").add(
            Syntax(text.rstrip(), "yaml", theme="ansi_dark", background_color="default")
        )
    return tree


def is_rank_zero() -> bool:
    """Whether this is the first process of a run (Lightning's DDP processes, torchrun and SLURM set the rank in
    the environment; without one, the only process). Read from the environment: Lightning is not imported yet."""
    return all(int(os.environ.get(name, 0)) == 0 for name in RANK_VARIABLES)


def print_config(cfg: DictConfig) -> None:
    """Print :func:`config_tree` to stdout (the first process only; colour only on a terminal)."""
    if is_rank_zero():
        Console(file=sys.stdout, soft_wrap=True).print(config_tree(cfg))


def extras(cfg: DictConfig) -> None:
    """At the start of a checked train config: its tags checked (one line when bad). The tree is printed by
    :func:`tvq_exp.run.fit.fit` once the run is built (the constructors' rules passed), so a refused config prints
    its one error line alone (``print_config=false``: never)."""
    check_tags(cfg)


__all__ = ["check_tags", "config_tree", "extras", "is_rank_zero", "print_config"]
