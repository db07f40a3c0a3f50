"""File digests by content, computed from the bytes on every read: no cache and no shortcut by size or
modification time, so a same-size edit with its mtime restored is still seen. :func:`sha256_of` is the digest a
catalogue records (Gutenberg's ``CATALOG.tsv``, the downloads' pins); the caches the project writes itself are
named and checked with a fast one (:func:`tvq_exp.data.content.content_digest`)."""

from __future__ import annotations

import hashlib
from pathlib import Path

CHUNK = 1 << 20


def sha256_of(path: Path) -> str:
    """The SHA-256 of the file at ``path`` (hex), read in chunks."""
    hasher = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK):
            hasher.update(chunk)
    return hasher.hexdigest()


__all__ = ["sha256_of"]
