"""The ``debug`` group (lightning-hydra-template's presets) composes, validates and does what it says;
``hparams_search`` is a group with a null default (``hparams_search=optuna`` without ``+``)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from tests.helpers.paths import CONF
from tvq_exp.run.train import train
from tvq_exp.run.validation import validate

needs_data = pytest.mark.needs_data("text/gutenberg")
PRESETS = sorted(p.stem for p in (CONF / "debug").glob("*.yaml"))


def composed(overrides: list[str]):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("train", overrides=overrides)


@pytest.mark.parametrize("preset", PRESETS)
def test_every_debug_preset_composes_and_validates(preset: str) -> None:
    cfg = composed(["experiment=smoke", f"debug={preset}"])
    validate(cfg)
    if preset == "device_profile":  # profiles the run as configured (a GPU's): only adds its callback
        assert cfg.callbacks.device_profile._target_.endswith("DeviceProfile")
        assert cfg.trainer == composed(["experiment=smoke"]).trainer
        return
    assert cfg.trainer.accelerator == "cpu" and cfg.trainer.detect_anomaly is True and not cfg.logger
    expected = {"fdr": ("fast_dev_run", True), "overfit": ("overfit_batches", 3), "limit": ("max_steps", 10)}
    if preset in expected:
        key, value = expected[preset]
        assert cfg.trainer[key] == value
    if preset == "profiler":
        assert cfg.trainer.profiler._target_.endswith("SimpleProfiler")


def test_hparams_search_is_a_group_with_a_null_default() -> None:
    assert composed([]).get("optimized_metric") is None
    assert composed(["hparams_search=optuna"]).optimized_metric == "val/bpb"


@needs_data
def test_fast_dev_run_trains_and_validates_one_batch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    overrides = ["experiment=smoke", "debug=fdr", f"paths.output_dir={tmp_path}"]
    result = train(composed(overrides), overrides)
    assert result["global_step"] == 1
    # bits, not nats, of a model one step from its start: near the log2(256) = 8 of a uniform guess over bytes
    val = result["val"]
    assert val["bpb"] == pytest.approx(val["loss"] / math.log(2), rel=1e-6) and 7.0 < val["bpb"] < 9.0, val
    (header,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("run dir ")]
    assert header.endswith("| 1 step (fast_dev_run)"), header  # not smoke's max_steps (20)
    assert not (tmp_path / "finished.json").exists() and not (tmp_path / "tensorboard").exists()
