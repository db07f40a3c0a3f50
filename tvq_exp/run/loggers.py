"""Loggers that continue a resumed run's history instead of starting it again.

Lightning's ``CSVLogger`` deletes an existing ``metrics.csv`` when it starts (with a warning), so a resumed run
kept only the rows after the resume. :class:`CSVLogger` here keeps the rows up to the step the run resumes from,
drops any row a killed process wrote after its last checkpoint, and appends. TensorBoard is told the same step
(``purge_step``), so the event files hold every step once (:func:`resume_options`).
"""

from __future__ import annotations

import csv
import os
from typing import Any

from lightning.fabric.loggers.logger import rank_zero_experiment
from lightning.pytorch.loggers import CSVLogger as LightningCSVLogger
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter


class _ContinuingWriter(ExperimentWriter):
    """``metrics.csv`` with the rows of steps ``<= keep_until`` kept (``None``: a fresh file)."""

    def __init__(self, log_dir: str, keep_until: int | None) -> None:
        self.keep_until = keep_until
        super().__init__(log_dir)
        if keep_until is not None and os.path.isfile(self.metrics_file_path):
            with open(self.metrics_file_path, newline="") as file:
                reader = csv.DictReader(file)
                keys, rows = list(reader.fieldnames or []), list(reader)
            kept = [row for row in rows if row.get("step", "") == "" or int(float(row["step"])) <= keep_until]
            self.metrics_keys = keys
            with open(self.metrics_file_path, "w", newline="") as file:
                writer = csv.DictWriter(file, fieldnames=keys)
                writer.writeheader()
                writer.writerows(kept)

    def _check_log_dir_exists(self) -> None:
        if self.keep_until is None and os.path.isfile(self.metrics_file_path):
            os.remove(self.metrics_file_path)  # a new run in an old directory: start the file again, quietly


class CSVLogger(LightningCSVLogger):
    """Lightning's ``CSVLogger`` (same arguments) that continues ``metrics.csv`` from step ``keep_until``
    (set by the train command when it resumes; ``None``: a new file)."""

    def __init__(self, *args: Any, keep_until: int | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.keep_until = keep_until

    @property
    @rank_zero_experiment
    def experiment(self) -> ExperimentWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _ContinuingWriter(self.log_dir, self.keep_until)
        return self._experiment


def resume_options(target: type, resume_step: int | None) -> dict[str, Any]:
    """Extra constructor arguments for a logger of class ``target`` when the run resumes at ``resume_step``."""
    if resume_step is None:
        return {}
    if issubclass(target, CSVLogger):
        return {"keep_until": resume_step}
    if issubclass(target, TensorBoardLogger):
        return {"purge_step": resume_step + 1}  # SummaryWriter drops the events logged after the checkpoint
    return {}


__all__ = ["CSVLogger", "resume_options"]
