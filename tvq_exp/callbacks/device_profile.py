"""Where a training step's time goes on the device: a torch.profiler window over a few optimiser steps after the
warm-up, written as a table and a JSON file (the profile a missed MFU target is explained by)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from torch.profiler import ProfilerActivity, profile

from tvq_exp.files import write_text
from tvq_exp.options import NonNegativeInt, PositiveInt, checked


class DeviceProfile(Callback):
    """Profiles optimiser steps ``skip .. skip + steps - 1`` (after compilation and warm-up) and writes
    ``<dirpath>/device-profile.json`` and ``device-profile.txt``.

    The JSON holds ``device`` (``cuda`` or ``cpu``), ``steps`` (the steps profiled), ``ms_per_step`` (the
    self time of every op on the device, per step: CUDA kernels and copies on a GPU, aten ops on a CPU) and
    ``rows``: the ``rows`` largest ops by self device time, each ``{"name", "ms_per_step", "share", "calls_per_step"}``
    (``share`` of ``ms_per_step``). The text file is torch's own table, sorted the same way. Rank 0 only; a run that
    ends inside the window writes what it profiled.

    Args:
        dirpath: the folder of the two files (the run directory).
        skip: optimiser steps before the window.
        steps: optimiser steps in it.
        rows: ops kept in the JSON and the table.
    """

    @checked
    def __init__(
        self, dirpath: str, skip: NonNegativeInt = 20, steps: PositiveInt = 5, rows: PositiveInt = 30
    ) -> None:
        self.dirpath, self.skip, self.steps, self.rows = Path(dirpath), skip, steps, rows
        self._profiler: profile | None = None
        self._first = 0

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, idx: int
    ) -> None:
        if self._profiler is None and trainer.is_global_zero and trainer.global_step == self.skip:
            activities = [ProfilerActivity.CPU]
            if torch.cuda.is_available() and pl_module.device.type == "cuda":
                activities.append(ProfilerActivity.CUDA)
                torch.cuda.synchronize()
            self._profiler, self._first = profile(activities=activities), trainer.global_step
            self._profiler.__enter__()

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, idx: int
    ) -> None:
        if self._profiler is not None and trainer.global_step >= self.skip + self.steps:
            self._finish(trainer.global_step - self._first)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._profiler is not None:
            self._finish(trainer.global_step - self._first)

    def _finish(self, steps: int) -> None:
        """Stop the window (``steps`` optimiser steps long) and write the two files."""
        cuda = ProfilerActivity.CUDA in self._profiler.activities
        if cuda:
            torch.cuda.synchronize()
        self._profiler.__exit__(None, None, None)
        averages, self._profiler = self._profiler.key_averages(), None
        key = "self_device_time_total" if cuda else "self_cpu_time_total"
        summary = profile_summary(averages, key, max(steps, 1), self.rows)
        summary["device"] = "cuda" if cuda else "cpu"
        self.dirpath.mkdir(parents=True, exist_ok=True)
        write_text("device-profile.json", self.dirpath, json.dumps(summary, indent=1) + "\n")
        write_text(
            "device-profile.txt", self.dirpath, averages.table(sort_by=key, row_limit=self.rows) + "\n"
        )


def profile_summary(averages: Any, key: str, steps: int, rows: int) -> dict[str, Any]:
    """``{"steps", "ms_per_step", "rows"}`` of torch.profiler's ``key_averages()`` by the self time ``key`` (µs),
    per step of ``steps``: every op's self time summed (``ms_per_step``), the ``rows`` largest with their share."""
    timed = [(event.key, getattr(event, key) / 1e3 / steps, event.count / steps) for event in averages]
    timed = sorted((t for t in timed if t[1] > 0), key=lambda t: -t[1])
    total = sum(ms for _, ms, _ in timed)
    return {
        "steps": steps,
        "ms_per_step": total,
        "rows": [
            {"name": name, "ms_per_step": ms, "share": ms / total, "calls_per_step": calls}
            for name, ms, calls in timed[:rows]
        ],
    }
