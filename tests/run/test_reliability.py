"""Exact resume, ``resume=auto``, truncated checkpoints, preemption signals and the numerics guard.

Runs are tiny (GAU-VQ, 2 layers, stream sampler with carried state, 64-byte segments of Shakespeare).
Test-only callbacks from ``reliability_helpers`` record losses, send real signals or inject NaNs.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from hydra import compose, initialize_config_dir
from lightning.pytorch.demos.boring_classes import BoringModel
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.helpers.paths import CONF, REPO
from tests.helpers.reliability import read_records
from tvq_exp.callbacks.checkpoint import BestAndLastCheckpoint
from tvq_exp.callbacks.numerics_guard import NumericsError
from tvq_exp.options import OptionError
from tvq_exp.run.checkpoints import CheckpointError, newest_good_checkpoint, read_checkpoint
from tvq_exp.run.safe_load import load_plain
from tvq_exp.run.train import train

BASE = [
    "experiment=smoke",
    "data=shakespeare",
    "data.seq_len=64",
    "data.batch_size=4",
    "data.eval_batch_size=4",
    "data.sampler=stream",
    "trainer.max_steps=20",
    "trainer.val_check_interval=5",
    "trainer.limit_val_batches=2",
    "trainer.log_every_n_steps=5",
    "trainer.enable_progress_bar=false",
    "trainer.accelerator=cpu",
    "trainer.precision=32-true",
]

needs_data = pytest.mark.needs_data("text")
pytestmark = needs_data


def callback(name: str, target: str, **kwargs: Any) -> list[str]:
    """Overrides adding the test callback ``tests.helpers.reliability.<target>(**kwargs)``."""
    args = [f"+callbacks.{name}.{key}={value}" for key, value in kwargs.items()]
    return [f"+callbacks.{name}._target_=tests.helpers.reliability.{target}", *args]


def record(path: Path) -> list[str]:
    """Overrides adding a :class:`Recorder` writing to ``path``."""
    return callback("recorder", "Recorder", path=str(path))


def run_train(overrides: list[str], run_dir: Path) -> dict[str, Any]:
    """Compose ``train.yaml`` (BASE + ``overrides``) and train in ``run_dir``."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=[*BASE, *overrides, f"paths.output_dir={run_dir}"])
    return train(cfg)


def auto(name: str) -> list[str]:
    return ["resume=auto", f"run_name={name}"]


def identical(a: Any, b: Any) -> bool:
    """Exact equality of nested lists/tuples/dicts of tensors and plain values."""
    if torch.is_tensor(a):
        return torch.is_tensor(b) and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(identical(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(map(identical, a, b))
    return a == b


def scalars(run_dir: Path, tag: str) -> list[tuple[int, float]]:
    """``(step, value)`` of a TensorBoard scalar in every event file under ``run_dir``."""
    values: list[tuple[int, float]] = []
    for path in sorted(run_dir.rglob("events.out.tfevents.*")):
        acc = EventAccumulator(str(path), size_guidance={"scalars": 0})
        acc.Reload()
        if tag in acc.Tags()["scalars"]:
            values += [(e.step, e.value) for e in acc.Scalars(tag)]
    return sorted(values)


# ------------------------------------------------------------------------------------------- exact resume


def test_preempted_and_resumed_run_equals_the_uninterrupted_run(tmp_path: Path) -> None:
    straight, pieces = tmp_path / "straight.jsonl", tmp_path / "pieces.jsonl"
    run_train(record(straight), tmp_path / "a")
    first = run_train([*auto("b"), *record(pieces), *callback("kill", "SignalAt", step=8)], tmp_path / "b")
    assert first["global_step"] == 8 and not (tmp_path / "b" / "finished.json").exists()
    assert read_checkpoint(tmp_path / "b" / "checkpoints" / "last.ckpt")["global_step"] == 8
    second = run_train([*auto("b"), *record(pieces)], tmp_path / "b")
    assert second["global_step"] == 20 and (tmp_path / "b" / "finished.json").is_file()

    expected, got = read_records(straight), read_records(pieces)
    assert [r["step"] for r in got] == list(range(1, 21))
    assert [r["loss"] for r in got] == [r["loss"] for r in expected]  # bit-for-bit, every step
    assert [r["checksum"] for r in got] == [r["checksum"] for r in expected]  # weights + codebooks
    a, b = (
        read_checkpoint(tmp_path / "a" / "checkpoints" / "last.ckpt"),
        read_checkpoint(tmp_path / "b" / "checkpoints" / "last.ckpt"),
    )
    for key, value in a["state_dict"].items():
        assert torch.equal(value, b["state_dict"][key]), key
    assert identical(a["train_state"], b["train_state"])  # the carried stream state
    # one TensorBoard run holding the same curves, each step logged once
    assert [p.name for p in (tmp_path / "b").iterdir() if p.name == "tensorboard"] == ["tensorboard"]
    for tag in ("train/loss", "val/bpb", "lr/lr", "codebook/layer0/perplexity"):
        assert scalars(tmp_path / "b", tag) == scalars(tmp_path / "a", tag), tag

    third = run_train([*auto("b"), *record(pieces)], tmp_path / "b")  # finished: skipped
    assert third["global_step"] == 20 and len(read_records(pieces)) == 20


def test_a_run_preempted_before_its_first_validation_keeps_writing_last_ckpt(tmp_path: Path) -> None:
    """The preemption's ``last.ckpt`` (written before ``ModelCheckpoint`` wrote any) is overwritten by the
    resumed run, not left behind beside a ``last-v1.ckpt``."""
    first = run_train([*auto("c"), *callback("kill", "SignalAt", step=3)], tmp_path / "c")
    assert first["global_step"] == 3
    run_train(auto("c"), tmp_path / "c")
    folder = tmp_path / "c" / "checkpoints"
    assert read_checkpoint(folder / "last.ckpt")["global_step"] == 20
    assert not [p.name for p in folder.glob("last-v*")]


# settings the kill-anywhere property must hold in: dropout (the RNG streams), the TBPTT sampler (its carried
# state), independent random windows, and the CSV logger (its history)
RESUME_SETTINGS = {
    "dropout": ["model.block.dropout=0.3", "model.embed_dropout=0.2"],
    "tbptt": ["data.sampler=tbptt", "data.sequence_len=256", "model.block.dropout=0.1"],
    "random": ["data.sampler=random", "model.block.dropout=0.1"],
    "csv": ["logger=csv"],
}


@pytest.mark.parametrize("setting", sorted(RESUME_SETTINGS))
def test_killed_anywhere_and_resumed_equals_uninterrupted(setting: str, tmp_path: Path) -> None:
    """Property: a SIGTERM at a random step (seeded per setting), then ``resume=auto``, gives the same losses,
    weights and codebooks as the uninterrupted run."""
    import random

    extra = RESUME_SETTINGS[setting]
    kill = random.Random(setting).randint(2, 18)
    straight, pieces = tmp_path / "straight.jsonl", tmp_path / "pieces.jsonl"
    run_train([*extra, *record(straight)], tmp_path / "a")
    run_train([*extra, *auto("b"), *record(pieces), *callback("kill", "SignalAt", step=kill)], tmp_path / "b")
    second = run_train([*extra, *auto("b"), *record(pieces)], tmp_path / "b")
    assert second["global_step"] == 20, f"killed at step {kill}"
    expected, got = read_records(straight), read_records(pieces)
    assert [r["step"] for r in got] == list(range(1, 21)), f"killed at step {kill}"
    assert [(r["loss"], r["checksum"]) for r in got] == [(r["loss"], r["checksum"]) for r in expected], kill
    if setting == "csv":  # one metrics file: the rows from before the kill kept, the resumed ones appended
        assert len(list((tmp_path / "b").rglob("metrics.csv"))) == 1
        assert csv_rows(tmp_path / "b", "train/loss") == csv_rows(tmp_path / "a", "train/loss")
        assert csv_rows(tmp_path / "b", "codebook/layer0/perplexity") == csv_rows(
            tmp_path / "a", "codebook/layer0/perplexity"
        )


def csv_rows(run_dir: Path, column: str) -> list[tuple[int, str]]:
    """``(step, value)`` of ``column`` in the run's ``metrics.csv``, in file order."""
    import csv

    (path,) = run_dir.rglob("metrics.csv")
    with path.open(newline="") as file:
        return [(int(row["step"]), row[column]) for row in csv.DictReader(file) if row.get(column)]


def test_run_name_fixes_the_run_directory() -> None:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        named = compose("train", overrides=["run_name=vq-s512"], return_hydra_config=True)
        unnamed = compose("train", return_hydra_config=True)
    assert named.hydra.run.dir == "logs/runs/vq-s512"
    assert named.hydra.sweep.dir == "logs/multiruns/vq-s512"
    assert unnamed.hydra.run.dir.startswith("logs/runs/20")


def test_resume_auto_needs_a_run_name(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="run_name"):
        run_train(["resume=auto"], tmp_path)


def test_last_checkpoint_follows_every_validation_when_the_best_does_not_improve(tmp_path: Path) -> None:
    """The monitored metric never improves after the first validation: the best file stays at step 2,
    ``last.ckpt`` still moves with every validation (plain Lightning >= 2.6 would leave it at step 2)."""

    class Flat(BoringModel):
        def validation_step(self, batch: Any, batch_idx: int) -> None:
            self.log("val/bpb", 1.0)

    checkpoint = BestAndLastCheckpoint(
        dirpath=tmp_path, filename="best-{step}", monitor="val/bpb", mode="min", save_top_k=1, save_last=True
    )
    trainer = L.Trainer(
        max_steps=6,
        val_check_interval=2,
        limit_val_batches=1,
        num_sanity_val_steps=0,
        callbacks=[checkpoint],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(Flat())
    assert sorted(p.name for p in tmp_path.glob("best-*.ckpt")) == ["best-step=2.ckpt"]
    assert load_plain(tmp_path / "last.ckpt")["global_step"] == 6  # a toy module: no tvq_exp run config


# ------------------------------------------------------------------------------------------- truncation


def test_truncated_checkpoint_is_refused_and_auto_falls_back(tmp_path: Path) -> None:
    run_dir, rows = tmp_path / "run", tmp_path / "rows.jsonl"
    overrides = [*auto("t"), "trainer.max_steps=12", *record(rows)]
    run_train([*overrides, *callback("kill", "SignalAt", step=7, signal_name="SIGUSR1")], run_dir)
    last = run_dir / "checkpoints" / "last.ckpt"
    assert read_checkpoint(last)["global_step"] == 7
    assert read_checkpoint(run_dir / "checkpoints" / "last.prev.ckpt")["global_step"] == 5
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])

    with pytest.raises(CheckpointError, match=r"last\.ckpt is truncated or corrupt"):
        read_checkpoint(last)
    with pytest.raises(CheckpointError, match=r"last\.ckpt"):
        run_train([f"ckpt_path={last}", "trainer.max_steps=12"], tmp_path / "explicit")
    good, refused = newest_good_checkpoint(run_dir / "checkpoints")
    assert good is not None and read_checkpoint(good)["global_step"] == 5 and len(refused) == 1

    before = len(read_records(rows))
    result = run_train(overrides, run_dir)
    resumed = read_records(rows)[before:]
    assert resumed[0]["step"] == 6 and result["global_step"] == 12


# ------------------------------------------------------------------------------------------- signals


def test_sigterm_to_a_training_process_saves_and_exits_0(tmp_path: Path) -> None:
    ready, rows = tmp_path / "ready", tmp_path / "rows.jsonl"
    args = [
        *BASE,
        *auto("pre"),
        "trainer.val_check_interval=1000",
        "torch_threads=1",
        f"paths.log_dir={tmp_path}",
        *record(rows),
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO / "tests"), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, str(REPO / "train.py"), *args]
    proc = subprocess.Popen(
        [*command, "trainer.max_steps=100000", *callback("ready", "TouchAt", step=3, path=str(ready))],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 180
    while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    assert "SIGTERM at step" in stdout
    step = read_checkpoint(tmp_path / "runs" / "pre" / "checkpoints" / "last.ckpt")["global_step"]
    assert step >= 3 and read_records(rows)[-1]["step"] == step

    done = subprocess.run(
        [*command, f"trainer.max_steps={step + 2}"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    assert [r["step"] for r in read_records(rows)][-2:] == [step + 1, step + 2]
    assert "weights_only" not in done.stderr and "Warning" not in done.stderr, done.stderr[
        -2000:
    ]  # quiet resume


@pytest.mark.parametrize("launcher", ["basic", "parallel", "local"])
def test_relaunched_sweep_skips_finished_jobs_and_resumes_the_others(launcher: str, tmp_path: Path) -> None:
    """Hydra's launchers (basic: one after the other; parallel: joblib; local: submitit subprocesses): one run
    directory per job, and a relaunch skips the finished job and resumes the other from its own checkpoint."""
    args = [
        *BASE,
        *auto("sweep"),
        "trainer.max_steps=4",
        "trainer.val_check_interval=2",
        "data.batch_size=2,4",
        f"hydra/launcher={launcher}",
    ]
    command = [sys.executable, str(REPO / "train.py"), "-m", *args, f"paths.log_dir={tmp_path}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    first = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    jobs = tmp_path / "multiruns" / "sweep"
    assert (jobs / "0" / "finished.json").is_file() and (jobs / "1" / "finished.json").is_file()
    for job in ("0", "1"):  # each job its own TensorBoard run
        assert list((jobs / job / "tensorboard").glob("events.out.tfevents.*")), job
    if launcher != "basic":  # the two jobs ran at the same time
        start = [(jobs / j / "config.yaml").stat().st_mtime for j in ("0", "1")]
        end = [(jobs / j / "finished.json").stat().st_mtime for j in ("0", "1")]
        assert start[0] < end[1] and start[1] < end[0], (start, end)
    (jobs / "1" / "finished.json").unlink()  # as if job 1 had been preempted after its last checkpoint
    again = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    logs = again.stdout + "".join(
        p.read_text() for p in jobs.glob(".submitit/*/*.out")
    )  # submitit's job logs
    assert logs.count("finished at step 4; skipped") == 1
    assert f"resuming from {jobs / '1' / 'checkpoints'}" in logs
    assert (jobs / "1" / "finished.json").is_file()


# ------------------------------------------------------------------------------------------- numerics


def test_nan_batch_is_skipped_and_reported(tmp_path: Path) -> None:
    rows = tmp_path / "rows.jsonl"
    result = run_train(
        [
            "trainer.max_steps=10",
            *record(rows),
            "+callbacks.nan._target_=tests.helpers.reliability.NanAt",
            "+callbacks.nan.steps=[4]",
        ],
        tmp_path / "run",
    )
    got = read_records(rows)
    assert result["global_step"] == 10 and len(got) == 10
    bad = got[4]
    assert bad["loss"] != bad["loss"]  # the injected NaN
    assert bad["checksum"] == got[3]["checksum"]  # no optimiser update, no codebook update
    assert all(r["finite"] for r in got) and all(r["loss"] == r["loss"] for i, r in enumerate(got) if i != 4)
    assert scalars(tmp_path / "run", "train/skipped_steps") == [(5, 1.0)]
    checkpoint = read_checkpoint(tmp_path / "run" / "checkpoints" / "last.ckpt")
    assert all(torch.isfinite(v).all() for v in checkpoint["state_dict"].values() if v.is_floating_point())


def test_consecutive_bad_steps_stop_the_run_with_a_good_checkpoint(tmp_path: Path) -> None:
    rows = tmp_path / "rows.jsonl"
    with pytest.raises(NumericsError, match=r"3 consecutive .*guard\.max_bad_steps=3.*last\.ckpt"):
        run_train(
            [
                "guard.max_bad_steps=3",
                "trainer.log_every_n_steps=1",
                *record(rows),
                *callback("nan", "NanAt", from_step=3),
            ],
            tmp_path / "run",
        )
    got = read_records(rows)
    assert [r["step"] for r in got] == [1, 2, 3, 4, 5, 6]
    assert got[-1]["checksum"] == got[2]["checksum"] and all(r["finite"] for r in got)
    checkpoint = read_checkpoint(tmp_path / "run" / "checkpoints" / "last.ckpt")
    assert checkpoint["global_step"] == 6
    assert not (tmp_path / "run" / "finished.json").exists()


def test_a_real_divergence_ends_in_one_error_line_and_a_loadable_checkpoint(tmp_path: Path) -> None:
    """``module.lr=1e30``: steps are skipped, validation reports NaN instead of raising, the guard stops the run
    with one ``error:`` line; ``last.ckpt`` loads, no NaN "best" file is written, and sample.py / eval.py refuse
    the diverged weights in one line."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    command = [
        sys.executable,
        str(REPO / "train.py"),
        *BASE,
        "module.lr=1e30",
        f"hydra.run.dir={tmp_path / 'run'}",
    ]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    errors = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 1 and len(errors) == 1 and errors[0].startswith("error: "), done.stderr[-3000:]
    assert "non-finite" in errors[0] and "Traceback" not in done.stderr
    assert "val/bpb nan" in done.stdout
    checkpoints = tmp_path / "run" / "checkpoints"
    read_checkpoint(checkpoints / "last.ckpt")  # loads
    assert not [p.name for p in checkpoints.glob("best*") if "nan" in p.name]
    sample = subprocess.run(
        [sys.executable, str(REPO / "sample.py"), f"ckpt_path={checkpoints / 'last.ckpt'}", "num_bytes=8"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    lines = [line for line in sample.stderr.splitlines() if line.strip()]
    assert sample.returncode == 2 and len(lines) == 1 and "ckpt_path" in lines[0], sample.stderr[-2000:]
    # weights that are NaN outright are refused by name when the checkpoint is loaded
    checkpoint = read_checkpoint(checkpoints / "last.ckpt")
    name = next(k for k, v in checkpoint["state_dict"].items() if v.is_floating_point())
    checkpoint["state_dict"][name] = torch.full_like(checkpoint["state_dict"][name], float("nan"))
    torch.save(checkpoint, tmp_path / "nan.ckpt")
    evaluate = subprocess.run(
        [sys.executable, str(REPO / "eval.py"), f"ckpt_path={tmp_path / 'nan.ckpt'}"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    lines = [line for line in evaluate.stderr.splitlines() if line.strip()]
    assert evaluate.returncode == 2 and len(lines) == 1 and name in lines[0], evaluate.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize(
    "kill", [("SIGTERM", 3), ("SIGTERM", 13), ("SIGKILL", 7), ("SIGKILL", 12), ("SIGKILL", 18)]
)
@pytest.mark.parametrize("setting", ["dropout", "tbptt"])
def test_killed_process_resumes_to_the_uninterrupted_run(
    setting: str, kill: tuple[str, int], tmp_path: Path
) -> None:
    """More kill points, as real signals to a real train.py process: SIGTERM (a checkpoint at the kill step) and
    SIGKILL between checkpoints (the run goes back to its last validation's checkpoint and trains those steps
    again); the last record of every step equals the uninterrupted run's."""
    name, step = kill
    extra = RESUME_SETTINGS[setting]
    straight, pieces, ready = tmp_path / "straight.jsonl", tmp_path / "pieces.jsonl", tmp_path / "ready"
    run_train([*extra, *record(straight)], tmp_path / "a")
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, str(REPO / "train.py"), *BASE, *extra, *auto("b"), "torch_threads=1",
               f"hydra.run.dir={tmp_path / 'b'}", *record(pieces)]  # fmt: skip
    proc = subprocess.Popen([*command, *callback("ready", "TouchAt", step=step, path=str(ready))], cwd=tmp_path,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline = time.monotonic() + 300
    while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.Signals[name])
    proc.communicate(timeout=120)
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    last = {r["step"]: r for r in read_records(pieces)}  # a step trained again after SIGKILL: its last record
    expected = read_records(straight)
    assert sorted(last) == [r["step"] for r in expected]
    assert [(last[r["step"]]["loss"], last[r["step"]]["checksum"]) for r in expected] == [
        (r["loss"], r["checksum"]) for r in expected
    ]


def test_a_versioned_last_checkpoint_is_refused() -> None:
    with pytest.raises(OptionError, match="enable_version_counter=True: must be false"):
        BestAndLastCheckpoint(enable_version_counter=True)
    assert BestAndLastCheckpoint()._enable_version_counter is False


def test_a_run_with_a_time_budget_is_finished_when_the_time_is_spent(tmp_path: Path) -> None:
    # a wall-clock budget (trainer.max_time) ends the run long before its max_steps: it is finished (finished.json,
    # so resume=auto and the study runner take it as done), validated at its last step and checkpointed there
    summary = run_train(
        ["trainer.max_steps=1000000", "+trainer.max_time=00:00:00:02", *auto("t")], tmp_path / "t"
    )
    assert 0 < summary["global_step"] < 1_000_000
    finished = json.loads((tmp_path / "t" / "finished.json").read_text())
    assert finished["global_step"] == summary["global_step"]
    assert finished["val"]["bpb"] == summary["val"]["bpb"]  # the validation at its last step, recorded
    assert finished["val"]["bpb"] == pytest.approx(summary["val"]["loss"] / math.log(2), rel=1e-6)
    assert (
        read_checkpoint(tmp_path / "t" / "checkpoints" / "last.ckpt")["global_step"] == summary["global_step"]
    )
