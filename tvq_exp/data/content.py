"""Content digests of encoded caches (the ``hf`` splits, the PG-19 concatenations): a fast hash (xxHash's XXH3,
64-bit) of a cache file's bytes is recorded when the file is written and checked each time it is opened, so a
cache edited in place, even at the same size, is refused instead of trained on. The corpora's own files keep
their SHA-256 (:mod:`tvq_exp.data.digests`); a cache needs only to be told apart from its edited self. Caches
live under :func:`cache_dir`, never in the data root (shared data roots are often read-only)."""

from __future__ import annotations

import os
from pathlib import Path

import xxhash

from tvq_exp.data.digests import hash_file
from tvq_exp.data.paths import CorruptFileError

ALGORITHM = "xxh3_64"
CACHE_ENV = "TVQ_CACHE_DIR"


def cache_dir() -> Path:
    """Where the project's caches go: ``$TVQ_CACHE_DIR``, else ``~/.cache/tvq_exp``."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "tvq_exp").expanduser()


def content_digest(path: Path) -> str:
    """The XXH3-64 digest of the file at ``path`` (hex)."""
    return hash_file(path, xxhash.xxh3_64())


def check_content(path: Path, expected: str, remedy: str) -> None:
    """Raise :class:`CorruptFileError` (one line, ``remedy`` appended) when ``path``'s digest is not ``expected``."""
    found = content_digest(path)
    if found != expected:
        raise CorruptFileError(
            f"{path}: content digest {ALGORITHM} {found} differs from the {expected} recorded when it was "
            f"written (edited since); {remedy}"
        )


__all__ = ["ALGORITHM", "CACHE_ENV", "cache_dir", "check_content", "content_digest"]
