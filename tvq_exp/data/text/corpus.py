"""The byte-corpus interface: ``prepare(root)`` fetches files, ``load(root)`` returns the three splits.

Relative ``path`` values of corpora resolve against the data root (``$TVQ_DATA_DIR``, else ``./data``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path

import numpy as np

SPLITS = ("train", "validation", "test")

Splits = dict[str, np.ndarray]


class ByteCorpus(ABC):
    """A byte corpus: ``prepare(root)`` fetches files (rank 0 only), ``load(root)`` returns the splits.

    ``load`` returns ``{"train", "validation", "test"}`` -> 1-D ``np.uint8`` arrays of shape ``(n_split,)``.
    """

    name: str = "corpus"

    def prepare(self, root: Path) -> None:  # noqa: B027 (optional hook, not abstract)
        """Fetch missing files; the default has nothing to fetch."""

    @abstractmethod
    def load(self, root: Path) -> Splits:
        """Read the three splits."""
