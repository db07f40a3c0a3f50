"""Bad inputs the schema alone does not catch, refused in one line (docs/reliability.md, "Bad input"): non-finite
hyper-parameters, ``trainer`` options Lightning would silently ignore or change, and an evaluation whose result is
not a number (exit status 1, like the numerics guard)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from tests.helpers.paths import CONF, REPO
from tvq_exp.run.errors import FAILURE_STATUS, reported
from tvq_exp.run.evaluate import evaluate
from tvq_exp.run.validation import ConfigError, validate

LEGACY = REPO / "tests" / "fixtures" / "legacy" / "gau_vq_before_layout.ckpt"


def _compose(name: str, overrides: list[str]) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(name, overrides=overrides)


@pytest.mark.parametrize(
    ("override", "key", "allowed"),
    [
        ("module.lr=inf", "module.lr", "must be > 0, and finite (not inf or nan)"),
        ("module.lr=nan", "module.lr", "must be > 0, and finite (not inf or nan)"),
        ("module.warmup_steps=inf", "module.warmup_steps", "must be of type int"),
        ("codebook.decay=nan", "codebook.decay", "finite"),
        ("trainer.gradient_clip_val=1.0", "trainer.gradient_clip_val", "set module.grad_clip instead"),
        ("+trainer.gradient_clip_algorithm=value", "trainer.gradient_clip_algorithm", "module.grad_clip"),
        ("trainer.precision=16", "trainer.precision", "fp16 needs a GPU"),
        ("trainer.precision=16-mixed", "trainer.precision", "use bf16-mixed or 32-true"),
    ],
)
def test_silently_ignored_or_non_finite_options_are_refused(override: str, key: str, allowed: str) -> None:
    overrides = ["experiment=smoke", "trainer.accelerator=cpu", override]
    with pytest.raises(ConfigError) as error:
        validate(_compose("train", overrides))
    assert error.value.key == key and allowed in error.value.allowed, str(error.value)


def test_gradient_clipping_through_the_module_and_zero_trainer_clip_are_accepted() -> None:
    validate(_compose("train", ["experiment=smoke", "module.grad_clip=1.0", "trainer.gradient_clip_val=0"]))


def test_an_evaluation_that_gives_nan_exits_1(
    tmp_path: Path, data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Finite weights (so the non-finite-weights check passes) large enough that the forward pass overflows."""
    checkpoint = torch.load(LEGACY, weights_only=False)
    weight = checkpoint["state_dict"]["model.blocks.0.w_vg.weight"]
    signs = torch.ones_like(weight)
    signs[:, 1::2] = -1  # every row sums +3e38 and -3e38 terms: inf - inf in the first block's projection
    checkpoint["state_dict"]["model.blocks.0.w_vg.weight"] = 3e38 * signs
    path = tmp_path / "overflow.ckpt"
    torch.save(checkpoint, path)
    output = tmp_path / "eval.json"
    cfg = _compose("eval", [f"ckpt_path={path}", "accelerator=cpu", "progress_bar=false", "limit_batches=1",
                            f"output={output}"])  # fmt: skip
    with pytest.raises(SystemExit) as exit_info:
        reported(evaluate)(cfg)
    assert exit_info.value.code == FAILURE_STATUS
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"error: eval of {path}: nan bits per byte") and str(output) in line
    assert output.is_file()


def test_ctrl_c_is_one_line_and_status_130(
    tmp_path: Path, data_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real SIGINT during training: Lightning exits 1 without a word; train.py says so in one line, status 130."""
    import importlib.util
    import signal
    import sys

    from hydra.core.global_hydra import GlobalHydra

    from tvq_exp.run.errors import INTERRUPTED_STATUS, run

    spec = importlib.util.spec_from_file_location("train_entry", REPO / "train.py")
    entry = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(entry)
    args = ["experiment=smoke", "data=shakespeare", "trainer.max_steps=50", "trainer.enable_progress_bar=false",
            "trainer.accelerator=cpu", "trainer.precision=32-true", f"paths.log_dir={tmp_path}",
            "+callbacks.stop._target_=tests.helpers.reliability.SignalAt", "+callbacks.stop.step=1",
            "+callbacks.stop.signal_name=SIGINT"]  # fmt: skip
    monkeypatch.setattr(sys, "argv", ["train.py", *args])
    GlobalHydra.instance().clear()
    # Python's own Ctrl-C handler, whatever this process inherited: a shell starts a background job (`make test &`)
    # with SIGINT ignored, and Python then installs none, so the signal would never reach the run
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(SystemExit) as exit_info:
            run("train", entry.main)
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # Lightning leaves Ctrl-C ignored
    assert exit_info.value.code == INTERRUPTED_STATUS
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: interrupted (SIGINT)"), line
