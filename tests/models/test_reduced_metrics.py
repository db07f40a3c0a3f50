"""What the module hands Lightning to reduce over processes: on a GPU run under NCCL, which reduces tensors on the
device only, a validation metric on the CPU failed at the end of the first validation (``No backend type associated
with device type cpu``); the gloo processes of the CPU tests reduce either."""

from __future__ import annotations

from typing import Any

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from tests.models.test_flops import tiny_preset
from tvq_exp.models.module import AutoregressiveLitModule


def test_validation_metrics_reach_lightnings_reduction_on_the_modules_device(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """At the epoch's end the module stands on a device no CPU tensor is on (``meta``, for a GPU): every metric
    logged with ``sync_dist`` is on it."""
    torch.manual_seed(0)
    model = tiny_preset("tiny")
    tokens = torch.randint(0, model.vocab_size, (8, 33))
    module = AutoregressiveLitModule(model, lr=1e-3, max_steps=1)
    logged: list[tuple[dict[str, torch.Tensor], dict[str, Any]]] = []
    epoch_end = module.on_validation_epoch_end

    def on_another_device() -> None:
        module._device = torch.device("meta")
        try:
            epoch_end()
        finally:
            module._device = torch.device("cpu")

    monkeypatch.setattr(module, "on_validation_epoch_end", on_another_device)
    monkeypatch.setattr(module, "log_dict", lambda metrics, **options: logged.append((metrics, options)))
    trainer = L.Trainer(
        accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False
    )
    trainer.validate(module, DataLoader([{"input": t[:-1], "target": t[1:]} for t in tokens], batch_size=4))
    reduced = {
        name: value
        for metrics, options in logged
        if options.get("sync_dist")
        for name, value in metrics.items()
    }
    assert {"val/loss", "val/bpb"} <= set(reduced)
    assert {value.device.type for value in reduced.values()} == {"meta"}
    assert module.eval_results["val"]["bpb"] == pytest.approx(
        module.eval_results["val"]["loss"] / 0.6931471805599453
    )
