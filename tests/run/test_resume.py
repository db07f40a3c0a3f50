"""``python train.py ckpt_path=<run>/checkpoints/last.ckpt [overrides]`` continues the stored run: its config
(trainer settings included) with the explicit overrides on top, in its own run dir, as the README says."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir

from tests.helpers.paths import CONF, REPO
from tvq_exp.callbacks.checkpoint import CHECKPOINT_DIR
from tvq_exp.resolvers import RUN_CHECKPOINTS, checkpoint_run_dir
from tvq_exp.run.resume import nothing_left, resume_config

needs_data = pytest.mark.needs_data("text/gutenberg")


def launch(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, str(REPO / "train.py"), *args], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip


def stored_run(tmp_path: Path) -> dict:
    """A resolved run config as a checkpoint stores it, its run dir ``/old/run``."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=["experiment=smoke", "paths.output_dir=/old/run"])
    from tvq_exp.run.build import to_dict

    return to_dict(cfg)


def current(overrides: list[str]):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("train", overrides=[*overrides, "paths.output_dir=/new/run"])


def test_the_stored_config_with_the_explicit_overrides_on_top(tmp_path: Path) -> None:
    stored = stored_run(tmp_path)
    overrides = ["ckpt_path=/old/run/checkpoints/last.ckpt", "trainer.max_steps=50", "logger=csv",
                 "+callbacks.extra._target_=tvq_exp.callbacks.throughput.Throughput", "~callbacks.samples"]  # fmt: skip
    cfg = resume_config(current(overrides), stored, overrides)
    assert cfg.trainer.max_steps == 50 and cfg.module.max_steps == 50  # the schedule follows the new length
    assert cfg.trainer.val_check_interval == 10 and cfg.data.seq_len == 64  # smoke's, from the stored run
    assert cfg.model.d_model == stored["model"]["d_model"] and cfg.module.lr == 3.0e-3
    assert cfg.logger.csv.save_dir == "/new/run" and "tensorboard" not in cfg.logger
    assert cfg.callbacks.model_checkpoint.dirpath == "/new/run/checkpoints"  # paths follow the run dir
    assert cfg.callbacks.extra._target_.endswith("Throughput") and "samples" not in cfg.callbacks
    kept = resume_config(current(["ckpt_path=x.ckpt"]), stored, ["ckpt_path=x.ckpt"])
    assert kept.trainer.max_steps == 20 and kept.module.max_steps == 20  # the stored length, not 100k
    again = ["experiment=smoke", "trainer.max_steps=30"]  # the first command repeated: experiment left out
    assert resume_config(current(again), stored, again).trainer.val_check_interval == 10


def test_nothing_left_says_so_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    resume_config(current(["experiment=smoke"]), stored_run(tmp_path), ["experiment=smoke"])
    assert capsys.readouterr().out.startswith("experiment=smoke: not laid over the resumed run")
    cfg = resume_config(current(["ckpt_path=a.ckpt"]), stored_run(tmp_path), ["ckpt_path=a.ckpt"])
    assert nothing_left(cfg, 19) is None
    assert nothing_left(cfg, 20) == {"best_val_bpb": None, "best_ckpt": None, "last_ckpt": "a.ckpt",
                                     "val": None, "global_step": 20}  # fmt: skip
    assert capsys.readouterr().out == (
        "a.ckpt is at step 20, trainer.max_steps=20: nothing to train (give trainer.max_steps=N to go on)\n"
    )


def test_the_run_dir_of_a_checkpoint() -> None:
    assert RUN_CHECKPOINTS == CHECKPOINT_DIR
    assert checkpoint_run_dir("logs/runs/a/checkpoints/last.ckpt", None) == "logs/runs/a"
    assert checkpoint_run_dir("logs/runs/a/checkpoints/last.ckpt", "fork") is None  # run_name: a new dir
    assert checkpoint_run_dir("/tmp/copied.ckpt", None) is None and checkpoint_run_dir(None, None) is None


@needs_data
def test_ckpt_path_continues_the_run_in_its_run_dir(tmp_path: Path) -> None:
    quiet = ["trainer.enable_progress_bar=false", "torch_threads=1"]
    first = launch(
        ["experiment=smoke", "trainer.max_steps=6", "trainer.val_check_interval=3", *quiet], tmp_path
    )
    assert first.returncode == 0, first.stderr[-2000:]
    (run_dir,) = (tmp_path / "logs" / "runs").iterdir()
    last = f"logs/runs/{run_dir.name}/checkpoints/last.ckpt"
    before = json.loads((run_dir / "finished.json").read_text())["val"]["bpb"]

    resumed = launch([f"ckpt_path={last}", "trainer.max_steps=12"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert [p.name for p in (tmp_path / "logs" / "runs").iterdir()] == [run_dir.name]  # no new run dir
    assert "dirpath" not in resumed.stderr and "has changed" not in resumed.stderr
    assert f"resuming {last} at step 6 of 12" in resumed.stdout
    assert not (run_dir / "train.log").exists() and not (run_dir / "codebook_sync.json").exists()  # 1 process
    finished = json.loads((run_dir / "finished.json").read_text())
    assert finished["global_step"] == 12
    # six more steps from the checkpoint's weights, not from a fresh start: below the 6-step run's bits
    assert finished["val"]["bpb"] == pytest.approx(finished["val"]["loss"] / math.log(2), rel=1e-6)
    assert finished["val"]["bpb"] < before - 0.05, (before, finished["val"])
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert config["trainer"]["val_check_interval"] == 3 and config["trainer"]["enable_progress_bar"] is False
    assert config["module"]["max_steps"] == 12
