"""File digests by content, computed from the bytes on every read: no cache and no shortcut by size or
modification time, so a same-size edit with its mtime restored is still seen. :func:`sha256_of` is the digest a
catalogue records (Gutenberg's ``CATALOG.tsv``, the downloads' pins); :func:`content_digest` a fast one (xxHash's
XXH3, 128 bits) for naming and checking caches the project writes itself."""

from __future__ import annotations

import hashlib
from pathlib import Path

import xxhash

CHUNK = 1 << 20


def sha256_of(path: Path) -> str:
    """The SHA-256 of the file at ``path`` (hex), read in chunks."""
    hasher = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK):
            hasher.update(chunk)
    return hasher.hexdigest()


def content_digest(path: Path) -> str:
    """The XXH3-128 of the file at ``path`` (hex; about 4x faster than SHA-256): for caches, not catalogues."""
    hasher = xxhash.xxh3_128()
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK):
            hasher.update(chunk)
    return hasher.hexdigest()


__all__ = ["content_digest", "sha256_of"]
