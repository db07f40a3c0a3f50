"""File digests by content, computed from the bytes on every read: no cache and no shortcut by size or
modification time, so a same-size edit with its mtime restored is still seen. :func:`sha256_of` is the digest a
catalogue records (Gutenberg's ``CATALOG.tsv``, the downloads' pins); the caches the project writes itself are
named and checked with a fast one (:func:`tvq_exp.data.content.content_digest`)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

CHUNK = 1 << 20


def hash_file(path: Path, hasher: Any) -> str:
    """The hex digest of ``hasher`` (hashlib's or xxhash's interface) fed the bytes of the file at ``path``,
    read in chunks."""
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK):
            hasher.update(chunk)
    return hasher.hexdigest()


def sha256_of(path: Path) -> str:
    """The SHA-256 of the file at ``path`` (hex)."""
    return hash_file(path, hashlib.sha256())


__all__ = ["hash_file", "sha256_of"]
