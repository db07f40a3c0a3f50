"""Checkpoints that survive crashes: atomic writes, truncation checks, RNG states, ``resume=auto``.

* :class:`AtomicCheckpointIO` (a Lightning ``CheckpointIO`` plugin) writes every checkpoint to a temporary
  file in the same folder, fsyncs it and ``os.replace``-s it into place; the file it overwrites
  (``last.ckpt``) is kept as ``last.prev.ckpt``. Loading refuses a truncated or corrupt file with a
  :class:`CheckpointError` naming it.
* :class:`BestAndLastCheckpoint` keeps the best checkpoint by the monitored metric and rewrites
  ``last.ckpt`` at every validation, improved or not.
* :class:`RngState` (a callback) stores the torch, numpy and python RNG states in checkpoints.
* :func:`newest_good_checkpoint` picks the newest checkpoint of a run folder that loads; a run that ended
  normally leaves ``finished.json`` (:func:`mark_finished`), so relaunching it skips it.

See ``docs/reliability.md``.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.fabric.plugins import TorchCheckpointIO
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

CHECKPOINT_DIR = "checkpoints"
LAST = "last.ckpt"
PREVIOUS_SUFFIX = ".prev"
FINISHED = "finished.json"
REQUIRED_KEYS = ("state_dict", "global_step")


class CheckpointError(RuntimeError):
    """A checkpoint file that cannot be used (truncated, corrupt, not a Lightning checkpoint)."""


def previous_path(path: Path) -> Path:
    """Where the checkpoint that ``path`` replaces is kept: ``last.ckpt`` -> ``last.prev.ckpt``."""
    return path.with_name(f"{path.stem}{PREVIOUS_SUFFIX}{path.suffix}")


def read_checkpoint(path: str | os.PathLike[str], map_location: Any = "cpu") -> dict[str, Any]:
    """Load a checkpoint written by this project; raise :class:`CheckpointError` if it is unusable."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist; check ckpt_path")
    try:
        checkpoint = torch.load(path, map_location=map_location, weights_only=False)
    except Exception as error:  # torch raises RuntimeError, EOFError, UnpicklingError, ... for bad files
        raise CheckpointError(
            f"checkpoint {path} is truncated or corrupt ({type(error).__name__}: {str(error).splitlines()[0]}); "
            f"delete it and resume from an older one (resume=auto picks the newest good one)"
        ) from None
    missing = [key for key in REQUIRED_KEYS if not isinstance(checkpoint, dict) or key not in checkpoint]
    if missing:
        raise CheckpointError(f"checkpoint {path} is not a training checkpoint (no {', '.join(missing)})")
    return checkpoint


class AtomicCheckpointIO(TorchCheckpointIO):
    """``torch.save`` to a temporary file, fsync, then ``os.replace``: a checkpoint is whole or absent.

    An overwritten checkpoint is kept as ``<stem>.prev.ckpt`` (the fallback when the new one is damaged
    on disk later). Loading goes through :func:`read_checkpoint` (clear error for truncated files).
    """

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: str | os.PathLike[str], storage_options: Any | None = None
    ) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        try:
            with open(temporary, "wb") as file:
                torch.save(checkpoint, file)
                file.flush()
                os.fsync(file.fileno())
            if path.is_file():
                os.replace(path, previous_path(path))
            os.replace(temporary, path)
        finally:
            temporary.unlink(missing_ok=True)

    def load_checkpoint(
        self, path: str | os.PathLike[str], map_location: Any | None = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        return read_checkpoint(path, map_location or "cpu")


class BestAndLastCheckpoint(ModelCheckpoint):
    """Lightning's ``ModelCheckpoint`` whose ``last.ckpt`` follows every validation.

    Since Lightning 2.6 a monitored ``ModelCheckpoint`` writes ``last.ckpt`` only when it also writes a
    new top-k file, so once the monitored metric stops improving ``last.ckpt`` stays behind (a resume
    from it would repeat, or lose, every step since the best). Here ``last.ckpt`` is written at the
    end of every validation in any case; the top-k files follow the monitor as before.
    """

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_validation_end(trainer, pl_module)  # top-k (and last, when a top-k file was written)
        if self.save_last and not self._should_skip_saving_checkpoint(trainer):
            if not self._should_save_on_train_epoch_end(trainer):
                self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))


class RngState(Callback):
    """Saves and restores the torch (CPU and CUDA), numpy and python RNG states with each checkpoint."""

    def state_dict(self) -> dict[str, Any]:
        state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            state["cuda"] = torch.cuda.get_rng_state_all()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        torch.set_rng_state(state_dict["torch"])
        np.random.set_state(state_dict["numpy"])
        random.setstate(state_dict["python"])
        if "cuda" in state_dict and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state_dict["cuda"])


def checkpoint_dir(trainer: L.Trainer) -> Path:
    """The run's checkpoint folder: the ``ModelCheckpoint``'s ``dirpath``, else ``<root>/checkpoints``."""
    callback = trainer.checkpoint_callback
    if isinstance(callback, ModelCheckpoint) and callback.dirpath:
        return Path(callback.dirpath)
    return Path(trainer.default_root_dir) / CHECKPOINT_DIR


def save_last(trainer: L.Trainer) -> Path:
    """Write ``last.ckpt`` now (call at the end of a training batch) and return its path."""
    path = checkpoint_dir(trainer) / LAST
    trainer.save_checkpoint(path)
    return path


def checkpoint_candidates(folder: Path) -> list[Path]:
    """Every checkpoint in ``folder``, newest first (``last.ckpt`` before others written at the same time)."""
    if not folder.is_dir():
        return []
    files = [p for p in folder.glob("*.ckpt") if p.is_file() and not p.name.startswith(".")]
    return sorted(files, key=lambda p: (p.stat().st_mtime_ns, p.name == LAST), reverse=True)


def newest_good_checkpoint(folder: Path) -> tuple[Path | None, list[str]]:
    """The newest checkpoint in ``folder`` that loads, and one line per newer file that was refused."""
    refused: list[str] = []
    for path in checkpoint_candidates(folder):
        try:
            read_checkpoint(path)
        except CheckpointError as error:
            refused.append(str(error))
            continue
        return path, refused
    return None, refused


def mark_finished(run_dir: Path, summary: dict[str, Any]) -> None:
    """Record that the run in ``run_dir`` reached its last step (``resume=auto`` then skips it)."""
    (run_dir / FINISHED).write_text(json.dumps(summary, indent=2) + "\n")


def finished_summary(run_dir: Path) -> dict[str, Any] | None:
    """The summary of a finished run in ``run_dir``, or ``None`` when it has not finished."""
    marker = run_dir / FINISHED
    return json.loads(marker.read_text()) if marker.is_file() else None


__all__ = [
    "AtomicCheckpointIO",
    "BestAndLastCheckpoint",
    "CheckpointError",
    "RngState",
    "checkpoint_candidates",
    "checkpoint_dir",
    "finished_summary",
    "mark_finished",
    "newest_good_checkpoint",
    "read_checkpoint",
    "save_last",
]
