"""Every run ends with a validation at its last step (:class:`FinalValidation`), once."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
from lightning.pytorch.demos.boring_classes import BoringModel

from tvq_exp.callbacks.final_validation import FinalValidation


class Validated(BoringModel):
    """Records the global step of every validation run."""

    def __init__(self) -> None:
        super().__init__()
        self.validated_at: list[int] = []

    def on_validation_epoch_end(self) -> None:
        self.validated_at.append(self.trainer.global_step)


@pytest.mark.parametrize(
    ("max_steps", "interval", "limit_val", "expected"),
    [(7, 4, 2, [4, 7]), (8, 4, 2, [4, 8]), (3, 50, 2, [3]), (3, 50, 0, [])],
)
def test_a_validation_at_the_last_step_once(
    tmp_path: Path, max_steps: int, interval: int, limit_val: int, expected: list[int]
) -> None:
    model = Validated()
    trainer = L.Trainer(
        max_steps=max_steps, val_check_interval=interval, check_val_every_n_epoch=None,
        limit_val_batches=limit_val, num_sanity_val_steps=0, callbacks=[FinalValidation()], logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        default_root_dir=tmp_path,
    )  # fmt: skip
    trainer.fit(model)
    assert trainer.global_step == max_steps and model.validated_at == expected
