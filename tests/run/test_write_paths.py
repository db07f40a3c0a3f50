"""Writes stay where they belong (docs/reliability.md, "Where files are written"): ``run_name`` is one folder
name inside the log dir, ``eval.py`` / ``sample.py`` ``output=`` needs an existing folder (no command creates
folders the user named), and what a checkpoint save killed half-way left is removed at the start of a run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from tests.helpers.paths import CONF, REPO
from tvq_exp.run.checkpoints import remove_stale_temporaries
from tvq_exp.run.validation import Command, ConfigError, validate


def _compose(name: str, overrides: list[str]) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(name, overrides=overrides)


@pytest.mark.parametrize("name", ["../../../x", "a/b", "..", ".hidden", "/tmp/abs", " "])
def test_run_name_must_be_one_folder_name(name: str) -> None:
    with pytest.raises(ConfigError, match=r"run_name=.*must be one plain folder name"):
        validate(_compose("train", ["experiment=smoke", f"run_name='{name}'"]))


def test_run_name_outside_the_log_dir_creates_nothing(tmp_path: Path) -> None:
    """Refused while Hydra resolves the run dir, before it creates it (and its ``.hydra/``)."""
    launch = tmp_path / "a" / "b"
    launch.mkdir(parents=True)
    proc = subprocess.run(
        [sys.executable, str(REPO / "train.py"), "run_name=../../../x", "experiment=smoke"],
        cwd=launch,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "run_name='../../../x'" in lines[0], lines
    assert [p.relative_to(tmp_path) for p in tmp_path.rglob("*")] == [Path("a"), Path("a/b")]


@pytest.mark.parametrize("command", ["eval", "sample"])
def test_output_needs_an_existing_folder_and_is_no_folder(command: str, tmp_path: Path) -> None:
    ckpt = tmp_path / "x.ckpt"
    ckpt.write_bytes(b"")
    missing = tmp_path / "no" / "such" / "out.json"
    kind = Command.EVAL if command == "eval" else Command.SAMPLE
    with pytest.raises(ConfigError, match=r"output=.*its folder .*no/such does not exist"):
        validate(_compose(command, [f"ckpt_path={ckpt}", f"output={missing}"]), kind)
    assert not (tmp_path / "no").exists()
    with pytest.raises(ConfigError, match=r"output=.*is a folder"):
        validate(_compose(command, [f"ckpt_path={ckpt}", f"output={tmp_path}"]), kind)
    validate(
        _compose(command, [f"ckpt_path={ckpt}", f"output={tmp_path / 'out.json'}"]), kind
    )  # an existing folder


def test_stale_temporary_checkpoints_are_removed_and_a_live_writers_kept(tmp_path: Path) -> None:
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    stale = tmp_path / f".last.ckpt.tmp-{int(dead.stdout)}"  # its writer has exited (a kill -9 mid-write)
    stale.write_bytes(b"")
    live = tmp_path / f".last.ckpt.tmp-{os.getppid()}"  # a writer that still runs
    live.write_bytes(b"")
    checkpoint = tmp_path / "last.ckpt"
    torch.save({"x": 1}, checkpoint)
    assert remove_stale_temporaries(tmp_path) == [stale]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, "last.ckpt"])
    assert remove_stale_temporaries(tmp_path / "absent") == []
