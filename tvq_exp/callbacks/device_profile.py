"""Where a training step's time goes on the device: a torch.profiler window over a few optimiser steps after the
warm-up, written as a table and a JSON file (the profile a missed MFU target is explained by)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from torch.profiler import ProfilerActivity, profile

from tvq_exp.files import write_text
from tvq_exp.measure.profile import compile_summary, host_summary, profile_summary
from tvq_exp.options import NonNegativeInt, PositiveInt, checked


class DeviceProfile(Callback):
    """Profiles optimiser steps ``skip .. skip + steps - 1`` (after compilation and warm-up) and writes
    ``<dirpath>/device-profile.json`` and ``device-profile.txt``.

    The JSON holds ``device`` (``cuda`` or ``cpu``), ``steps`` (the steps profiled), ``ms_per_step`` (the
    self time of every op on the device, per step: CUDA kernels, copies and memsets on a GPU, aten ops on a CPU),
    ``wall_ms_per_step`` (the window's wall clock per step, the device synchronised at both ends, the profiler's
    own overhead included), ``busy_share`` (``ms_per_step / wall_ms_per_step``: below 1, the device waits for the
    host), ``by_kind`` (``ms_per_step`` by :func:`~tvq_exp.measure.profile.kernel_kind`: the GEMMs', SDPA's, the
    fused VQ kernels', inductor's, the copies' and the rest's), ``calls_per_step`` (kernel launches per step on a
    GPU, ops on a CPU) and ``rows``: the ``rows`` largest by self time, each ``{"name", "ms_per_step", "share",
    "calls_per_step"}`` (``share`` of ``ms_per_step``), and ``compile``: what ``torch.compile`` did in the process
    up to the window's end (:func:`~tvq_exp.measure.profile.compile_summary`: graphs, frames, graph breaks and their
    reasons, the functions resumed after them), so a profile of a compiled step says whether it compiled whole, and
    ``host``: the host's ops by their self CPU time (:func:`~tvq_exp.measure.profile.host_summary`: ``ms_per_step``,
    ``calls_per_step``, ``rows``), what the host spent its step on where the device waited for it.

    On a GPU only the device's own events count. The host-side op that launched a kernel has the kernel's time as
    its self device time, so the host ops are left out: counted too, they counted each kernel twice. The text
    file is torch's own table, sorted the same way. Rank 0 only; a run that ends inside the window writes what it
    profiled.

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
        self._first, self._started = 0, 0.0

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
            self._started = time.perf_counter()

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
        wall_ms = (time.perf_counter() - self._started) * 1e3
        self._profiler.__exit__(None, None, None)
        averages, self._profiler = self._profiler.key_averages(), None
        key = "self_device_time_total" if cuda else "self_cpu_time_total"
        summary = profile_summary(
            averages, key, max(steps, 1), self.rows, device_events=cuda, wall_ms=wall_ms
        )
        summary["device"] = "cuda" if cuda else "cpu"
        summary["host"] = host_summary(averages, max(steps, 1), self.rows)
        summary["compile"] = compile_summary()  # after the window: the step's compilation is over
        self.dirpath.mkdir(parents=True, exist_ok=True)
        write_text("device-profile.json", self.dirpath, json.dumps(summary, indent=1) + "\n")
        write_text(
            "device-profile.txt", self.dirpath, averages.table(sort_by=key, row_limit=self.rows) + "\n"
        )
