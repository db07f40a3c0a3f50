"""Logs survive ``kill -9`` (docs/reliability.md, "Logs after kill -9"): a real training process killed with
SIGKILL between two checkpoints, then resumed with ``resume=auto``, leaves TensorBoard and ``metrics.csv``
holding every step once, with the uninterrupted run's values: the rows of the steps trained again replaced, the
validation before the kill kept. What that takes, each shown alone: the resumed run's event file is read after the
killed one's made in the same second, and a checkpoint is written after what was logged before it."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from lightning.pytorch.loggers import TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.summary.writer.record_writer import RecordWriter
from torch.utils.tensorboard import SummaryWriter

from tests.helpers.paths import CONF, REPO
from tests.run.test_reliability import BASE as RELIABILITY_BASE
from tvq_exp.run.checkpoints import AtomicCheckpointIO
from tvq_exp.run.loggers import ResumePoint, continue_history, wait_to_sort_last
from tvq_exp.run.train import train

CHANGED = {"trainer.max_steps": "12", "trainer.val_check_interval": "4", "trainer.log_every_n_steps": "1"}
BASE = [
    *(o for o in RELIABILITY_BASE if o.split("=")[0] not in CHANGED),
    *(f"{key}={value}" for key, value in CHANGED.items()),
    "logger=[tensorboard,csv]",
    "torch_threads=1",
]
KILL = 6  # between the checkpoints of steps 4 and 8
LATE = "test/late_write"  # a scalar TensorBoard's writer thread is slow to write


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


def _steps(run_dir: Path, tag: str) -> list[int]:
    """The steps of ``tag`` in the run's TensorBoard folder (none while it is not there)."""
    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    return [e.step for e in events.Scalars(tag)] if tag in events.Tags()["scalars"] else []


def test_the_resumed_runs_event_file_is_read_after_the_killed_ones_of_the_same_second(tmp_path: Path) -> None:
    """The killed process made its event file in the second the resumed one makes its own, named to sort after
    any other of that second (host ``~``): TensorBoard read the resumed file first, steps 4, 5 before 0..3."""
    scratch = tmp_path / "scratch"
    with SummaryWriter(str(scratch)) as writer:
        for step in range(4):
            writer.add_scalar("train/loss", float(step), step)
    folder = tmp_path / "tensorboard"
    folder.mkdir()
    (made,) = scratch.glob("events.out.tfevents.*")
    made.rename(folder / f"events.out.tfevents.{int(time.time()):010d}.~.1.0")
    logger = TensorBoardLogger(save_dir=tmp_path, name="tensorboard", version="")
    continue_history(logger, ResumePoint(4, time.time()))
    for step in (4, 5):
        logger.log_metrics({"train/loss": float(step)}, step)
    logger.finalize("success")
    assert _steps(tmp_path, "train/loss") == [0, 1, 2, 3, 4, 5]
    ahead = tmp_path / "ahead"
    ahead.mkdir()
    (ahead / f"events.out.tfevents.{int(time.time()) + 3600:010d}.host.1.0").touch()
    assert wait_to_sort_last(ahead) < 0.5, "a clock an hour ahead (another host's) is not waited for"


def test_a_checkpoint_is_written_after_what_was_logged_before_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scalar a callback adds straight to TensorBoard's writer before the checkpoint of its step (as the sample
    and codebook callbacks do) is in the event file when the checkpoint is written, though the writer's thread
    takes 0.5 s over it: a ``kill -9`` after the checkpoint cannot lose it (the resumed run does not log it again)."""
    write = RecordWriter.write

    def late(self: RecordWriter, data: bytes) -> None:
        if LATE.encode() in data:
            time.sleep(0.5)
        write(self, data)

    save = AtomicCheckpointIO.save_checkpoint
    written: list[tuple[int, list[int]]] = []

    def checked(
        self: AtomicCheckpointIO, checkpoint: dict, path: str, storage_options: object = None
    ) -> None:
        written.append((checkpoint["global_step"], _steps(tmp_path, LATE)))
        save(self, checkpoint, path, storage_options)

    monkeypatch.setattr(RecordWriter, "write", late)
    monkeypatch.setattr(AtomicCheckpointIO, "save_checkpoint", checked)
    late_callback = [
        "+callbacks.late._target_=tests.helpers.reliability.ScalarAtValidation",
        f"+callbacks.late.tag={LATE}",
    ]
    _train(late_callback, tmp_path)
    assert {step for step, _ in written} == {4, 8, 12}
    assert all(step in steps for step, steps in written), written
