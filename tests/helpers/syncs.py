"""A test-only callback that counts host-device synchronisations per training step (added with
``+callbacks.syncs._target_=tests.helpers.syncs.SyncsPerStep``): the real run, counted.

From ``on_train_batch_start`` to ``on_train_batch_end`` (this callback's, which Lightning calls after the other
callbacks' before it: listed last, it sees their hooks too) it counts with
:func:`tvq_exp.measure.syncs.counting_syncs` and appends ``{"step", "events"}`` (``step``: the optimiser step
after the batch) to ``path`` as one JSON line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback

from tvq_exp.measure.syncs import counting_syncs


class SyncsPerStep(Callback):
    """Appends each training batch's host reads to ``path`` (JSON lines)."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self._counting: Any = None

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._counting = counting_syncs()
        self._syncs = self._counting.__enter__()

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._counting.__exit__(None, None, None)
        row = {"step": trainer.global_step, "events": [f"{k} at {p}" for k, p in self._syncs.events]}
        with self.path.open("a") as file:
            file.write(json.dumps(row) + "\n")


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows a :class:`SyncsPerStep` wrote."""
    return [json.loads(line) for line in path.read_text().splitlines()]
