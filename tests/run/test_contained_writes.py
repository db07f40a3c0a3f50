"""A training run writes only inside its run dir and leaves whole logs (docs/reliability.md, "Contained writes and
faults"): a run dir holding a link to outside is refused before anything is written through it; a second run with
the same ``run_name`` refuses while the first one runs; a run killed before its first checkpoint and launched
again leaves TensorBoard and ``metrics.csv`` with every step once; a checkpoint write that fails on disk stops in one
line and keeps the last good checkpoint; ``eval.py output=/dev/null`` is refused."""

from __future__ import annotations

import csv
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.helpers.paths import CONF, REPO
from tests.run.test_kill9_logs import BASE
from tests.run.test_reliability import needs_data
from tvq_exp.files import lock_run_dir
from tvq_exp.run.checkpoints import read_checkpoint
from tvq_exp.run.validation import Command, ConfigError, validate

pytestmark = needs_data
ENV = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}


def _train(run_dir: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    command = [
        sys.executable,
        str(REPO / "train.py"),
        *BASE,
        "run_name=r",
        f"hydra.run.dir={run_dir}",
        *extra,
    ]
    return subprocess.run(command, cwd=run_dir.parent, env=ENV, capture_output=True, text=True, timeout=300)


def _one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
    assert proc.returncode == 2 and lines and lines[-1].startswith("error: "), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    return lines[-1]


def test_a_link_in_the_run_dir_is_refused_and_the_outside_is_untouched(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "last.ckpt").write_text("someone else's file")
    (outside / "config.yaml").write_text("someone else's config")
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    (run_dir / "checkpoints").symlink_to(outside)
    (run_dir / "config.yaml").symlink_to(outside / "config.yaml")
    line = _one_error_line(_train(run_dir, "trainer.max_steps=4"))
    assert "is a symbolic link" in line and str(run_dir) in line, line
    assert sorted(p.name for p in outside.iterdir()) == ["config.yaml", "last.ckpt"]
    assert (outside / "last.ckpt").read_text() == "someone else's file"
    assert (outside / "config.yaml").read_text() == "someone else's config"


def test_a_second_run_with_the_same_run_name_refuses_in_one_line(tmp_path: Path) -> None:
    run_dir = tmp_path / "r"
    held = lock_run_dir(run_dir)  # the first run, still writing
    try:
        line = _one_error_line(_train(run_dir, "trainer.max_steps=4"))
    finally:
        held.close()
    assert f"run dir {run_dir} is in use by another run" in line, line
    assert not (run_dir / "checkpoints").exists() and not (run_dir / "tensorboard").exists()


def _steps(run_dir: Path, tag: str) -> tuple[list[int], list[int]]:
    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    (path,) = run_dir.rglob("metrics.csv")
    with open(path, newline="") as file:
        rows = [int(row["step"]) for row in csv.DictReader(file) if row.get(tag)]
    return [e.step for e in events.Scalars(tag)], rows


def test_a_run_killed_before_its_first_checkpoint_and_relaunched_logs_every_step_once(tmp_path: Path) -> None:
    run_dir = tmp_path / "r"
    kill = ["+callbacks.kill._target_=tests.helpers.reliability.SignalAt", "+callbacks.kill.step=3",
            "+callbacks.kill.signal_name=SIGKILL"]  # fmt: skip
    killed = _train(run_dir, *kill, "resume=auto")
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert not list(run_dir.rglob("*.ckpt")) and _steps(run_dir, "train/loss")[0], "no events before the kill"
    done = _train(run_dir, "resume=auto")
    assert done.returncode == 0, done.stderr[-2000:]
    events, rows = _steps(run_dir, "train/loss")
    assert events == sorted(set(events)) == rows == list(range(12)), (events, rows)


@pytest.mark.parametrize(("command", "device"), [("eval", "/dev/null"), ("sample", "/dev/full")])
def test_a_device_as_output_is_refused(command: str, device: str, tmp_path: Path) -> None:
    ckpt = tmp_path / "x.ckpt"
    ckpt.write_bytes(b"")
    kind = Command.EVAL if command == "eval" else Command.SAMPLE
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(command, [f"ckpt_path={ckpt}", f"output={device}"])
    with pytest.raises(ConfigError, match=rf"output='{device}': is not a regular file"):
        validate(cfg, kind)
    link = tmp_path / "out.json"
    link.symlink_to(tmp_path / "elsewhere.json")
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(command, [f"ckpt_path={ckpt}", f"output={link}"])
    with pytest.raises(ConfigError, match=r"is a symbolic link"):
        validate(cfg, kind)
    assert not Path(device + ".png").exists() and not (tmp_path / "elsewhere.json").exists()


def _file_size_limit() -> None:
    """In the child: writes past 1 MiB fail with ``EFBIG``, as a full disk fails them with ``ENOSPC``."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))


def test_a_checkpoint_write_that_fails_stops_in_one_line_and_keeps_the_last_good_one(tmp_path: Path) -> None:
    """A real write failure during training (the process's file-size limit, below one checkpoint's size): one
    ``error:`` line naming the file, exit 1; the last good checkpoint is whole and loads; no temporary is left."""
    run_dir = tmp_path / "r"
    assert _train(run_dir, "trainer.max_steps=4", "resume=auto").returncode == 0
    before = (run_dir / "checkpoints" / "last.ckpt").read_bytes()
    command = [sys.executable, str(REPO / "train.py"), *BASE, "run_name=r", f"hydra.run.dir={run_dir}",
               "trainer.max_steps=8", "resume=auto"]  # fmt: skip
    proc = subprocess.run(command, cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=300,
                          preexec_fn=_file_size_limit)  # fmt: skip
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert (
        lines[-1].startswith(f"error: {run_dir / 'checkpoints'}/")
        and "cannot write (File too large)" in lines[-1]
    )
    assert (run_dir / "checkpoints" / "last.ckpt").read_bytes() == before
    assert read_checkpoint(run_dir / "checkpoints" / "last.ckpt")["global_step"] == 4
    assert not [p for p in (run_dir / "checkpoints").iterdir() if p.name.startswith(".")]


def test_eval_into_a_folder_that_takes_no_file_stops_before_evaluating(tmp_path: Path) -> None:
    run_dir = tmp_path / "r"
    assert _train(run_dir, "trainer.max_steps=2").returncode == 0
    command = [sys.executable, str(REPO / "eval.py"), f"ckpt_path={run_dir / 'checkpoints' / 'last.ckpt'}",
               "output=/sys/tvq-eval.json", "progress_bar=false"]  # fmt: skip
    proc = subprocess.run(command, cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=300)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert lines[-1].startswith("error: /sys: cannot write (Permission denied)"), lines[-1]
    assert "bits/byte" not in proc.stdout + proc.stderr  # refused before the evaluation ran
