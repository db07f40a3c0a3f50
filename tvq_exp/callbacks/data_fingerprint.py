"""A fingerprint of the training data in every checkpoint, compared when the run resumes or is evaluated, so a
corpus that grew, shrank or changed is refused instead of silently mixing two data sets (docs/reliability.md,
"Data integrity"). ``allow_data_change=true`` accepts a deliberate change."""

from __future__ import annotations

import hashlib
from typing import Any

import lightning as L
import numpy as np
from lightning.pytorch.callbacks import Callback

from tvq_exp.data.paths import CorruptFileError

SPLITS = ("train", "validation", "test")
EDGE = 1 << 20  # bytes hashed at each end of a split
BLOCKS, BLOCK = 256, 4096  # evenly spaced blocks hashed in between


class DataChangedError(CorruptFileError):
    """The data differ from those a checkpoint was trained on."""


def split_fingerprint(data: np.ndarray) -> list[Any]:
    """``[length, digest]`` of a 1-D byte split: BLAKE2b of its first and last MiB and 256 evenly spaced 4 KiB
    blocks (any size in milliseconds; a change in length, at either end or in a sampled block is caught)."""
    view = np.asarray(data).reshape(-1).view(np.uint8)
    hasher = hashlib.blake2b(digest_size=16)
    hasher.update(view[:EDGE].tobytes())
    hasher.update(view[-EDGE:].tobytes())
    for start in np.linspace(0, max(len(view) - BLOCK, 0), BLOCKS, dtype=np.int64):
        hasher.update(view[start : start + BLOCK].tobytes())
    return [len(view), hasher.hexdigest()]


def data_fingerprint(datamodule: Any) -> dict[str, list[Any]] | None:
    """The fingerprint of each split of a data module with ``split(name)`` (text corpora), else ``None``."""
    if datamodule is None or not callable(getattr(datamodule, "split", None)):
        return None
    try:
        return {name: split_fingerprint(datamodule.split(name)) for name in SPLITS}
    except (RuntimeError, KeyError):  # not set up, or no such split
        return None


class DataFingerprint(Callback):
    """Records :func:`data_fingerprint` in each checkpoint; on resume (``load_state_dict``) or against
    ``expected`` (``eval.py``), refuses different data with :class:`DataChangedError` unless ``allow_change``."""

    def __init__(self, allow_change: bool = False, expected: dict[str, list[Any]] | None = None) -> None:
        self.allow_change = allow_change
        self.expected = expected
        self.current: dict[str, list[Any]] | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.current = data_fingerprint(trainer.datamodule)
        if self.expected is not None:
            self.compare(self.expected)

    def state_dict(self) -> dict[str, Any]:
        return {"fingerprint": self.current}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.compare(state_dict.get("fingerprint"))

    def compare(self, stored: dict[str, list[Any]] | None) -> None:
        """Refuse when ``stored`` (the checkpoint's) and the current fingerprint both exist and differ."""
        if self.allow_change or stored is None or self.current is None or stored == self.current:
            return
        changed = [s for s in SPLITS if stored.get(s) != self.current.get(s)]
        sizes = ", ".join(
            f"{s} {stored.get(s, ['?'])[0]} -> {self.current.get(s, ['?'])[0]} bytes" for s in changed
        )
        raise DataChangedError(
            f"the data differ from those the checkpoint was trained on ({sizes}): a corpus that grew, shrank or "
            "was edited; restore it, or set allow_data_change=true to go on with the new data"
        )


__all__ = ["DataChangedError", "DataFingerprint", "data_fingerprint", "split_fingerprint"]
