"""Step 1 of a train run: read and verify what the files hold (:func:`read_start`).

Nothing here builds anything or looks at the command line's options beyond where to start from: ``ckpt_path``
(the checkpoint the user named) or ``resume=auto`` (the newest good checkpoint of the fixed run dir, and whether
the run already finished). Each checkpoint is read by the one safe loader and its stored run checked as data
(:func:`~tvq_exp.run.checkpoints.read_checkpoint`, :func:`~tvq_exp.run.stored.stored_run`); the result,
a :class:`Start`, goes to :mod:`tvq_exp.run.compose`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from tvq_exp.run.stored import stored_run


@dataclasses.dataclass(frozen=True)
class Start:
    """Where a train run starts: from scratch (``checkpoint is None``), or from ``checkpoint`` at ``step``
    (saved at ``saved_at``, a ``time.time()``) with its stored run (``stored``: :func:`stored_run`'s plain data).
    ``relaunch``: found by ``resume=auto`` (the same command again) rather than named by ``ckpt_path``;
    ``finished``: the summary of a run that reached its end (``resume=auto`` then skips it when nothing is left)."""

    checkpoint: str | None = None
    stored: dict[str, Any] | None = None
    step: int = 0
    saved_at: float = 0.0
    relaunch: bool = False
    finished: dict[str, Any] | None = None


def read_start(cfg: DictConfig) -> Start:
    """The :class:`Start` of the train command ``cfg``: ``ckpt_path`` read and verified, or for ``resume=auto``
    (without ``ckpt_path``) the run dir's ``finished.json`` and its newest checkpoint that loads (one line per
    damaged newer one; a checkpoint that asks for more than data stops the search and the command)."""
    if not cfg.get("ckpt_path") and cfg.get("resume") != "auto":
        return (
            Start()
        )  # a new run: nothing is read, and Lightning is not imported (a bad value is refused fast)
    # the checkpoint reader imports Lightning (its checkpoint plugin): only when a file is read
    from tvq_exp.console import say  # noqa: PLC0415
    from tvq_exp.run.checkpoints import CHECKPOINT_DIR, finished_summary, newest_good_checkpoint  # noqa: PLC0415

    if cfg.get("ckpt_path"):
        return _started(str(cfg.ckpt_path), relaunch=False)
    run_dir = Path(cfg.paths.output_dir)
    finished = finished_summary(run_dir)
    checkpoint, refused = newest_good_checkpoint(run_dir / CHECKPOINT_DIR)
    for reason in refused:
        say(f"skipped: {reason}")
    if checkpoint is None:
        return Start(finished=finished)
    return dataclasses.replace(_started(str(checkpoint), relaunch=True), finished=finished)


def _started(path: str, relaunch: bool) -> Start:
    from tvq_exp.run.checkpoints import read_checkpoint, saved_at  # noqa: PLC0415

    checkpoint = read_checkpoint(path)
    stored = stored_run(checkpoint["hyper_parameters"]["run_config"], f"checkpoint {path}")
    step = int(checkpoint.get("global_step", 0))
    return Start(path, stored, step, saved_at(path, checkpoint), relaunch)


__all__ = ["Start", "read_start"]
