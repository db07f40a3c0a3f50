"""The progress bar disappears when training ends, as its docstring says (Rich erases a transient display)."""

from __future__ import annotations

import io
from pathlib import Path

import lightning as L
from lightning.pytorch.demos.boring_classes import BoringModel

from tvq_exp.callbacks.progress_bar import QuietProgressBar


def test_the_bar_erases_itself_at_the_end(tmp_path: Path) -> None:
    screen = io.StringIO()
    bar = QuietProgressBar(
        refresh_rate=1, console_kwargs={"file": screen, "force_terminal": True, "width": 100}
    )
    trainer = L.Trainer(
        max_steps=3, limit_val_batches=1, val_check_interval=3, callbacks=[bar], logger=False,
        enable_checkpointing=False, enable_model_summary=False, default_root_dir=tmp_path,
    )  # fmt: skip
    trainer.fit(BoringModel())
    shown = screen.getvalue()
    assert "Epoch 0" in shown and "3/3" in shown  # it was drawn
    assert shown.endswith("\r\x1b[1A\x1b[2K")  # then: cursor back up over the bar, line erased
