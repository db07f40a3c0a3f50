"""A checkpoint written before the package was rearranged (tests/fixtures/legacy: a 4-step gau_vq run made with
the flat layout and evaluated there on 3 validation batches, its ``eval.json`` beside it) still loads in
``eval.py`` and gives the same loss on the same batches."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from tests.helpers.paths import CONF, REPO
from tvq_exp.run.evaluate import evaluate

FIXTURE = REPO / "tests" / "fixtures" / "legacy" / "gau_vq_before_layout"


def test_a_checkpoint_from_before_the_layout_evaluates_as_it_did(tmp_path: Path, data_dir: Path) -> None:
    then = json.loads(FIXTURE.with_suffix(".eval.json").read_text())
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("eval", overrides=[f"ckpt_path={FIXTURE.with_suffix('.ckpt')}", "accelerator=cpu",
                                         "progress_bar=false", "limit_batches=3", f"output={tmp_path / 'e.json'}"])  # fmt: skip
    now = evaluate(cfg)
    assert now["tokens"] == then["tokens"] == 3 * 16 * 32
    assert now["loss"] == pytest.approx(then["loss"], rel=1e-6)
    assert now["bpb"] == pytest.approx(then["bpb"], rel=1e-6)
