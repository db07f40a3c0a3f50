"""A train run's start (tvq_exp/run/extras.py): the composed config printed as a tree, the tags checked."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig
from rich.console import Console

from tests.helpers.paths import CONF
from tvq_exp.run.extras import check_tags, config_tree
from tvq_exp.run.train import train
from tvq_exp.run.validation import ConfigError


def composed(*overrides: str) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("train", overrides=["experiment=smoke", *overrides])


def rendered(cfg: DictConfig) -> str:
    console = Console(file=io.StringIO(), width=120, color_system=None)
    console.print(config_tree(cfg))
    return console.file.getvalue()


def test_the_tree_shows_each_section_resolved() -> None:
    text = rendered(composed("model.attention.codebook_size=24", "tags=[a,b]", "paths.output_dir=/tmp/out"))
    branches = [line.strip("├└─│ ") for line in text.splitlines() if line.startswith(("├── ", "└── "))]
    assert branches[:5] == ["model", "codebook", "data", "module", "trainer"] and branches[-1] == "top level"
    assert "codebook_size: 24" in text  # the command line's value, in the model's branch
    assert "max_steps: 20" in text and "${trainer.max_steps}" not in text  # resolved
    assert "- a" in text and "- b" in text  # the tags, under the top level


@pytest.mark.parametrize("bad", ["tags=oops", "tags=[a,'b c']", "tags=[1,2]"])
def test_bad_tags_are_one_line_errors(bad: str) -> None:
    with pytest.raises(ConfigError, match=r"^tags=.*: must be a list of words"):
        check_tags(composed(bad))


def test_no_tags_is_an_empty_list() -> None:
    assert check_tags(composed()) == [] and check_tags(composed("tags=[v1,s-512]")) == ["v1", "s-512"]


def test_a_run_refuses_bad_tags_before_training(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigError, match="tags"):
        train(composed("tags=oops", f"paths.output_dir={tmp_path / 'run'}"), [])
    assert (
        not (tmp_path / "run").exists() and "├── model" not in capsys.readouterr().out
    )  # nothing written or shown
