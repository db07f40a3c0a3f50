"""``python train.py ckpt_path=<run>/checkpoints/last.ckpt [overrides]`` continues the stored run: its model, data,
module and seed from the checkpoint (plain data, rebuilt from the tree), the explicit overrides on top, and the
trainer, callbacks and loggers from the tree and the command line, never from the file; in its own run dir."""

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
from tvq_exp.run.compose import compose_run
from tvq_exp.run.resume import Start
from tvq_exp.run.stored import stored_run
from tvq_exp.run.train import nothing_left
from tvq_exp.run.validation import ConfigError

needs_data = pytest.mark.needs_data("text/gutenberg")


def launch(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, str(REPO / "train.py"), *args], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip


def stored_start(relaunch: bool = False) -> Start:
    """A checkpoint of an ``experiment=smoke`` run at step 8 (its stored run, as a checkpoint holds it)."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=["experiment=smoke", "seed=7", "paths.output_dir=/old/run"])
    from tvq_exp.run.build import to_dict

    return Start("/old/run/checkpoints/last.ckpt", stored_run(to_dict(cfg), "x"), 8, 0.0, relaunch)


def current(overrides: list[str]):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("train", overrides=[*overrides, "paths.output_dir=/new/run"])


def test_the_stored_run_with_the_explicit_overrides_on_top_and_the_rest_from_the_tree() -> None:
    overrides = ["ckpt_path=/old/run/checkpoints/last.ckpt", "trainer.max_steps=50", "logger=csv",
                 "+callbacks.extra._target_=tvq_exp.callbacks.throughput.Throughput", "~callbacks.samples",
                 "module.lr=0.01", "++model.attention.codebook.temperature=0.5"]  # fmt: skip
    cfg = compose_run(current(overrides), stored_start(), overrides)
    assert cfg.trainer.max_steps == 50 and cfg.module.max_steps == 50  # the schedule follows the new length
    assert (
        cfg.data.seq_len == 64 and cfg.seed == 7 and cfg.module.warmup_steps == 5
    )  # smoke's, from the checkpoint
    assert cfg.module.lr == 0.01 and cfg.model.attention.codebook.temperature == 0.5  # the given keys on top
    assert (
        cfg.trainer.val_check_interval == 1000
    )  # the tree's (trainer/default.yaml), not the stored run's 10
    assert cfg.logger.csv.save_dir == "/new/run" and "tensorboard" not in cfg.logger
    assert cfg.callbacks.model_checkpoint.dirpath == "/new/run/checkpoints"
    assert cfg.callbacks.extra._target_.endswith("Throughput") and "samples" not in cfg.callbacks
    kept = compose_run(current(["ckpt_path=x.ckpt"]), stored_start(), ["ckpt_path=x.ckpt"])
    assert kept.trainer.max_steps == 20 and kept.module.max_steps == 20  # the stored length, not 100k
    stretched = ["ckpt_path=x.ckpt", "trainer.max_steps=40", "module.max_steps=30"]
    assert compose_run(current(stretched), stored_start(), stretched).module.max_steps == 30


def test_resume_auto_takes_the_stored_parts_and_the_command_line_length() -> None:
    again = ["experiment=smoke", "trainer.max_steps=30", "run_name=r", "resume=auto", "module.lr=9"]
    cfg = compose_run(current(again), stored_start(relaunch=True), again)
    assert cfg.module.max_steps == 30 and cfg.module.lr == 3.0e-3  # the same command again: the stored module
    assert cfg.trainer.val_check_interval == 10 and cfg.ckpt_path is None  # smoke's, from this command line


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("experiment=smoke", "experiment"),
        ("debug=fdr", "debug"),
        ("+sweep=codebook_size", "sweep"),
        ("codebook_size=64", "codebook_size"),
        ("block_len=16", "block_len"),
        ("codebook=gradient", "codebook"),
        ("codebook.decay=0.5", "codebook.decay"),
    ],
)
def test_what_cannot_be_laid_over_a_stored_run_is_one_line(override: str, key: str) -> None:
    given = ["ckpt_path=x.ckpt", override]
    with pytest.raises(ConfigError) as error:
        compose_run(current(given), stored_start(), given)
    assert error.value.key == key and "ckpt_path" in error.value.allowed and "\n" not in str(error.value)


def test_nothing_left_says_so_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    cfg = compose_run(current(["ckpt_path=a.ckpt"]), stored_start(), ["ckpt_path=a.ckpt"])
    early = Start("a.ckpt", {}, 19)
    assert nothing_left(cfg, early) is None
    assert capsys.readouterr().out == "resuming a.ckpt at step 19 of 20\n"
    assert nothing_left(cfg, Start("a.ckpt", {}, 20)) == {"best_val_bpb": None, "best_ckpt": None,
                                                         "last_ckpt": "a.ckpt", "val": None, "global_step": 20}  # fmt: skip
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

    trainer = [
        "trainer=cpu",
        "trainer.max_steps=12",
        "trainer.val_check_interval=3",
        "trainer.limit_val_batches=4",
    ]
    resumed = launch([f"ckpt_path={last}", *trainer, *quiet], tmp_path)  # the trainer is the command line's
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
    assert config["trainer"]["val_check_interval"] == 3 and config["data"]["seq_len"] == 64  # smoke's, stored
    assert config["module"]["max_steps"] == 12
