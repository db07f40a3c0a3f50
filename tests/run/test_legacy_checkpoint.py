"""Checkpoints written by earlier versions still load and evaluate as they did (``tests/fixtures/legacy``, each
with the ``eval.json`` its own version wrote over the first 3 validation batches):

* ``gau_vq_before_layout``: a 4-step gau_vq run made with the flat package layout;
* ``gau_vq_before_architecture``: a 4-step run of ``experiment=smoke`` made on b72b227, before the backend folders,
  the typed recurrent states, the codebook update rules and the weights-only loading (its carried training state is
  the old per-block dicts, its codebook config the old ``dead_code_threshold``).

The second one also resumes: the new code reads its carried state and trains on from it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from tests.helpers.paths import CONF, REPO
from tvq_exp.models.blocks.common import BlockState
from tvq_exp.models.legacy import upgrade_train_state
from tvq_exp.run.evaluate import evaluate
from tvq_exp.run.safe_load import load_plain

FIXTURES = REPO / "tests" / "fixtures" / "legacy"


@pytest.mark.parametrize("name", ["gau_vq_before_layout", "gau_vq_before_architecture"])
def test_an_old_checkpoint_evaluates_as_it_did(name: str, tmp_path: Path, data_dir: Path) -> None:
    fixture = FIXTURES / name
    then = json.loads(fixture.with_suffix(".eval.json").read_text())
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("eval", overrides=[f"ckpt_path={fixture.with_suffix('.ckpt')}", "accelerator=cpu",
                                         "progress_bar=false", "limit_batches=3", f"output={tmp_path / 'e.json'}"])  # fmt: skip
    now = evaluate(cfg)
    assert now["tokens"] == then["tokens"] == 3 * 16 * 32
    assert now["loss"] == pytest.approx(then["loss"], rel=1e-6)
    assert now["bpb"] == pytest.approx(then["bpb"], rel=1e-6)


def test_the_old_carried_state_becomes_typed_states_with_the_same_tensors() -> None:
    saved = load_plain(FIXTURES / "gau_vq_before_architecture.ckpt")["train_state"]
    assert isinstance(saved[0], dict) and "t" in saved[0]  # the old layout, as written then
    typed = upgrade_train_state(saved)
    assert [type(s) for s in typed] == [BlockState] * len(saved)
    for old, new in zip(saved, typed, strict=True):
        assert new.position == old["t"] and new.attn.position == old["attn"]["t"]
        assert torch.equal(new.attn.k, old["attn"]["k"]) and torch.equal(new.attn.codes, old["attn"]["codes"])
    assert upgrade_train_state([s.to_plain() for s in typed]) == typed  # and as written now, round trip


def test_an_old_checkpoint_resumes_from_its_carried_state(tmp_path: Path, data_dir: Path) -> None:
    checkpoints = tmp_path / "run" / "checkpoints"
    checkpoints.mkdir(parents=True)
    shutil.copy(FIXTURES / "gau_vq_before_architecture.ckpt", checkpoints / "last.ckpt")
    proc = subprocess.run(
        [sys.executable, str(REPO / "train.py"), f"ckpt_path={checkpoints / 'last.ckpt'}", "trainer.max_steps=6",
         "trainer.enable_progress_bar=false", "torch_threads=1"],
        cwd=tmp_path, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    finished = json.loads((tmp_path / "run" / "finished.json").read_text())
    assert finished["global_step"] == 6
    resumed = load_plain(checkpoints / "last.ckpt")
    assert resumed["global_step"] == 6 and resumed["train_state"][0]["state"] == "BlockState"
