"""Logs survive ``kill -9`` (docs/reliability.md, "Logs after kill -9"): a real training process killed with
SIGKILL between two checkpoints, then resumed with ``resume=auto``, leaves TensorBoard and ``metrics.csv``
holding every step once, with the uninterrupted run's values: the rows of the steps trained again replaced, the
validation before the kill kept."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

from hydra import compose, initialize_config_dir
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.helpers.paths import CONF, REPO
from tests.run.test_reliability import BASE as RELIABILITY_BASE
from tvq_exp.run.train import train

CHANGED = {"trainer.max_steps": "12", "trainer.val_check_interval": "4", "trainer.log_every_n_steps": "1"}
BASE = [
    *(o for o in RELIABILITY_BASE if o.split("=")[0] not in CHANGED),
    *(f"{key}={value}" for key, value in CHANGED.items()),
    "logger=[tensorboard,csv]",
    "torch_threads=1",
]
KILL = 6  # between the checkpoints of steps 4 and 8


def _train(overrides: list[str], run_dir: Path) -> None:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        train(compose("train", overrides=[*BASE, *overrides, f"paths.output_dir={run_dir}"]))


def _scalars(run_dir: Path, tag: str) -> list[tuple[int, float]]:
    """The curve TensorBoard shows: the run's event files read as one folder, in order (``purge_step`` applies
    across them)."""
    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    return [(e.step, e.value) for e in events.Scalars(tag)]


def _rows(run_dir: Path, column: str) -> list[tuple[int, str]]:
    (path,) = run_dir.rglob("metrics.csv")
    with open(path, newline="") as file:
        return [(int(row["step"]), row[column]) for row in csv.DictReader(file) if row.get(column)]


def test_sigkill_between_checkpoints_then_resume_logs_every_step_once(tmp_path: Path) -> None:
    _train([], tmp_path / "a")
    kill = ["+callbacks.kill._target_=tests.helpers.reliability.SignalAt", f"+callbacks.kill.step={KILL}",
            "+callbacks.kill.signal_name=SIGKILL"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    killed = subprocess.run(
        [
            sys.executable,
            str(REPO / "train.py"),
            *BASE,
            *kill,
            "resume=auto",
            "run_name=b",
            f"hydra.run.dir={tmp_path / 'b'}",
        ],  # fmt: skip
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert _rows(tmp_path / "b", "train/loss")[-1][0] == KILL - 2, "the killed run logged past its checkpoint"
    _train(["resume=auto", "run_name=b"], tmp_path / "b")
    for tag in ("train/loss", "val/bpb"):
        expected = _scalars(tmp_path / "a", tag)
        assert _scalars(tmp_path / "b", tag) == expected, tag
        assert len({step for step, _ in expected}) == len(expected)
        assert _rows(tmp_path / "b", tag) == _rows(tmp_path / "a", tag), tag
    assert [step for step, _ in _rows(tmp_path / "a", "val/bpb")] == [4, 8, 12]
