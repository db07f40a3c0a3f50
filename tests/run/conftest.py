"""A real checkpoint shared by the tests that tamper with one (tests/run/test_trust.py, test_file_is_data.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from tests.helpers.paths import CONF
from tvq_exp.run.errors import USAGE_STATUS, reported

QUIET = ["trainer.enable_progress_bar=false", "trainer.accelerator=cpu", "trainer.precision=32-true"]


@pytest.fixture(scope="session")
def good_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run dir of a real 2-step run of the smoke model on tiny Shakespeare (``checkpoints/last.ckpt``,
    ``config.yaml``)."""
    from tvq_exp.run.train import train

    out = tmp_path_factory.mktemp("good")
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(
            "train",
            ["experiment=smoke", "data=shakespeare", "data.seq_len=64", "trainer.max_steps=2", *QUIET]
            + [f"paths.output_dir={out}"],
        )
    train(cfg, overrides=[])
    return out


@pytest.fixture
def good(good_run: Path) -> dict[str, Any]:
    """:func:`good_run`'s ``last.ckpt``, loaded without restrictions (a fresh copy per test, to tamper with)."""
    return torch.load(good_run / "checkpoints" / "last.ckpt", weights_only=False)


def refused(capsys: pytest.CaptureFixture[str], task: Callable[[DictConfig], Any], cfg: DictConfig) -> str:
    """Run ``task`` as its command does (:func:`~tvq_exp.run.errors.reported`): it must exit with the usage status
    and one ``error:`` line on stderr, which is returned."""
    with pytest.raises(SystemExit) as exit_info:
        reported(task)(cfg)
    assert exit_info.value.code == USAGE_STATUS
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]
