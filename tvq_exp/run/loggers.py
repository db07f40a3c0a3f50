"""Loggers that continue a resumed run's history instead of starting it again.

Lightning's ``CSVLogger`` deletes an existing ``metrics.csv`` when it starts (with a warning), so a resumed run
kept only the rows after the resume. :class:`CSVLogger` here keeps the rows written before the checkpoint the run
resumes from was saved, drops those a killed process wrote after it, and appends; it writes every row at once
(Lightning's buffers rows for 100 steps, so a ``kill -9`` lost the last validation row). TensorBoard's event files
are cut the same way (:func:`drop_events_after`), so they hold every step once, and the resumed run's event file
is named to be read after them (:func:`wait_to_sort_last`).

The cut (:class:`ResumePoint`) is by step and time: Lightning logs optimiser step ``k`` at index ``k - 1`` and our
validation and callbacks at ``k``, so at a checkpoint of ``global_step`` ``K`` the rows at index ``K`` are the
validation logged before the save (kept) and a killed process's next step (trained again: dropped). A row is kept
when its step is below ``K`` (the steps up to the checkpoint, also the last one a SIGTERM logs after its save) or
it was written before the checkpoint was saved. Every CSV row carries its ``wall_time`` (as TensorBoard events
do), and a checkpoint its ``saved_at`` (:class:`~tvq_exp.run.checkpoints.AtomicCheckpointIO`).
"""

from __future__ import annotations

import csv
import dataclasses
import os
import re
import time
from pathlib import Path
from typing import Any

from lightning.fabric.loggers.logger import rank_zero_experiment
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch.loggers import CSVLogger as LightningCSVLogger
from lightning.pytorch.loggers import Logger, TensorBoardLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
from tensorboard.compat.proto import event_pb2
from tensorboard.summary.writer.record_writer import RecordWriter

from tvq_exp.files import atomic_write

WALL_TIME = "wall_time"  # the column of metrics.csv that says when a row was logged (time.time())
EVENT_GLOB = "events.out.tfevents.*"
# TensorBoard's event file name: events.out.tfevents.<second it was made, 10 digits>.<host>.<pid>.<counter>
CREATED = re.compile(r"events\.out\.tfevents\.(\d+)\.")


@dataclasses.dataclass(frozen=True)
class ResumePoint:
    """Where a resumed run continues its logs: the checkpoint's ``global_step`` and ``saved_at`` (a ``time.time()``)."""

    step: int
    saved_at: float

    def keeps(self, step: int, wall_time: float | None) -> bool:
        """Whether a row or event logged at ``step`` and ``wall_time`` (``None``: unknown) stays in the history."""
        return step < self.step or (wall_time is not None and wall_time <= self.saved_at)


START = ResumePoint(0, float("-inf"))  # a run from step 0: no earlier row or event is kept


class _ContinuingWriter(ExperimentWriter):
    """``metrics.csv`` with the rows ``keep_until`` keeps (``None``: a fresh file); every new row gets its
    ``wall_time``."""

    def __init__(self, log_dir: str, keep_until: ResumePoint | None) -> None:
        self.keep_until = keep_until
        super().__init__(log_dir)
        if keep_until is not None and os.path.isfile(self.metrics_file_path):
            with open(self.metrics_file_path, newline="") as file:
                reader = csv.DictReader(file)
                keys, rows = list(reader.fieldnames or []), list(reader)
            kept = [
                row for row in rows
                if not row.get("step") or keep_until.keeps(int(float(row["step"])), _number(row.get(WALL_TIME)))
            ]  # fmt: skip
            self.metrics_keys = keys
            with open(self.metrics_file_path, "w", newline="") as file:
                writer = csv.DictWriter(file, fieldnames=keys)
                writer.writeheader()
                writer.writerows(kept)

    def log_metrics(self, metrics_dict: dict[str, float], step: int | None = None) -> None:
        super().log_metrics({**metrics_dict, WALL_TIME: time.time()}, step)

    def _check_log_dir_exists(self) -> None:
        if self.keep_until is None and os.path.isfile(self.metrics_file_path):
            os.remove(self.metrics_file_path)  # a new run in an old directory: start the file again, quietly


class CSVLogger(LightningCSVLogger):
    """Lightning's ``CSVLogger`` (same arguments) that continues ``metrics.csv`` with the rows the
    :class:`ResumePoint` ``(resume_step, resume_time)`` keeps (set by the train command when it resumes; ``None``:
    a new file), and writes each row to disk when it is logged."""

    def __init__(
        self, *args: Any, resume_step: int | None = None, resume_time: float | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.keep_until = None if resume_step is None else ResumePoint(resume_step, resume_time or 0.0)

    @rank_zero_only
    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        super().log_metrics(metrics, step)
        self.save()  # validation rows are logged outside Lightning's save() calls: on disk before the checkpoint

    @property
    @rank_zero_experiment
    def experiment(self) -> ExperimentWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _ContinuingWriter(self.log_dir, self.keep_until)
        return self._experiment


def _number(text: str | None) -> float | None:
    return float(text) if text else None


def resume_options(target: type, resumed: ResumePoint | None) -> dict[str, Any]:
    """Extra constructor arguments for a logger of class ``target`` when the run resumes at ``resumed``."""
    if resumed is not None and issubclass(target, CSVLogger):
        return {"resume_step": resumed.step, "resume_time": resumed.saved_at}
    return {}


def continue_history(logger: Logger, resumed: ResumePoint | None) -> None:
    """Before a run logs: cut a TensorBoard logger's event files at ``resumed`` (:func:`drop_events_after`); a
    run that starts at step 0 in a folder with old events (``None``: killed before its first checkpoint and
    launched again) drops them all, as a :class:`CSVLogger` starts its file again (``keep_until``). The file the
    run then makes is read after them (:func:`wait_to_sort_last`)."""
    if isinstance(logger, TensorBoardLogger) and os.path.isdir(logger.log_dir):
        drop_events_after(Path(logger.log_dir), resumed or START)
        wait_to_sort_last(Path(logger.log_dir))


def wait_to_sort_last(folder: Path, limit_s: float = 2.0) -> float:
    """Wait until an event file made now sorts after every one in ``folder``; the seconds waited.

    TensorBoard reads a folder's event files in the order of their names, which start with the second the file
    was made (:data:`CREATED`) and go on with the host and the pid. A run resumed in the second its killed
    process made its file (a short run) made one of the same second, sorted by pid: the resumed process's, often
    the lower, came first, and TensorBoard read the continued curve before the steps it continues (steps 4.. then
    0..3). A file of a later second sorts after, so this waits for the clock to pass the newest file's second
    (under a second, only right after such a run); at most ``limit_s``: a name from a clock further ahead
    (another host's) is left where it sorts."""
    made = [int(match[1]) for path in folder.glob(EVENT_GLOB) if (match := CREATED.match(path.name))]
    start = time.monotonic()
    while made and 0 < (delay := max(made) + 1 - time.time()) <= limit_s:
        time.sleep(delay)
    return time.monotonic() - start


def drop_events_after(folder: Path, resumed: ResumePoint) -> int:
    """Rewrite each TensorBoard event file in ``folder`` without the scalar events ``resumed`` does not keep (what
    a killed process logged after its checkpoint; the resumed run logs those steps again); the number dropped."""
    dropped = 0
    for path in sorted(folder.glob(EVENT_GLOB)):
        records = list(RawEventFileLoader(str(path)).Load())
        events = [event_pb2.Event.FromString(r) for r in records]
        kept = [
            r for r, e in zip(records, events, strict=True)
            if not e.HasField("summary") or resumed.keeps(e.step, e.wall_time)
        ]  # fmt: skip
        if len(kept) == len(records):
            continue
        dropped += len(records) - len(kept)
        with atomic_write(path.name, folder) as file:
            writer = RecordWriter(file)
            for record in kept:
                writer.write(record)
            writer.flush()
    return dropped


__all__ = [
    "CSVLogger",
    "ResumePoint",
    "continue_history",
    "drop_events_after",
    "resume_options",
    "wait_to_sort_last",
]
