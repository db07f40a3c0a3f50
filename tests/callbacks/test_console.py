"""What the console shows: the per-validation summary line names the right metric, and the progress bar's
epoch label is sensible for step-bounded runs."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from tvq_exp.callbacks.progress_bar import QuietProgressBar
from tvq_exp.callbacks.validation_summary import ValidationSummary


def _summary_line(metrics: dict[str, float], capsys: pytest.CaptureFixture[str]) -> str:
    trainer = SimpleNamespace(
        global_step=7, callback_metrics={k: torch.tensor(v) for k, v in metrics.items()}
    )
    ValidationSummary().report(trainer)
    return capsys.readouterr().out.strip()


def test_text_summary_reports_bits_per_byte(capsys: pytest.CaptureFixture[str]) -> None:
    line = _summary_line({"val/bpb": 1.25, "val/loss": 0.8664, "train/loss": 0.9}, capsys)
    assert line.startswith("step 7 | val/bpb 1.2500 | train/loss 0.9000 | ")


def test_image_summary_reports_bits_per_dim_not_bpb(capsys: pytest.CaptureFixture[str]) -> None:
    line = _summary_line({"val/bpb": 3.5, "val/bpd": 3.5, "train/loss": 2.4}, capsys)
    assert "val/bpd 3.5000" in line and "val/bpb" not in line


def test_probe_summary_adds_accuracy(capsys: pytest.CaptureFixture[str]) -> None:
    line = _summary_line({"val/bpb": 0.5, "val/acc": 0.875, "train/loss": 0.3}, capsys)
    assert "val/bpb 0.5000 | val/acc 0.8750 | train/loss 0.3000" in line


@pytest.mark.parametrize(("max_epochs", "label"), [(-1, "Epoch 2"), (None, "Epoch 2"), (5, "Epoch 2/4")])
def test_progress_bar_epoch_label(max_epochs: int | None, label: str) -> None:
    bar = QuietProgressBar()
    bar._trainer = SimpleNamespace(max_epochs=max_epochs)
    assert bar._get_train_description(2).strip() == label
