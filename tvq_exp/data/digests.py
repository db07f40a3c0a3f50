"""File digests paid once per file, not once per run: a file's SHA-256 is cached by its resolved path, size and
modification time (``st_mtime_ns``) in ``$TVQ_CACHE_DIR/sha256.json`` (default ``~/.cache/tvq_exp``), outside
the data root, which may be shared and read-only. A file rewritten in place gets a new mtime, so a new digest;
the cache is only a shortcut and can be deleted at any time. An unwritable cache folder is skipped quietly."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

CACHE_ENV = "TVQ_CACHE_DIR"
CACHE_FILE = "sha256.json"
CHUNK = 1 << 20


def cache_dir() -> Path:
    """``$TVQ_CACHE_DIR``, else ``~/.cache/tvq_exp``."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "tvq_exp").expanduser()


def sha256_of(path: Path) -> str:
    """The SHA-256 of the file at ``path`` (hex), read in chunks."""
    hasher = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK):
            hasher.update(chunk)
    return hasher.hexdigest()


def file_sha256(path: Path) -> str:
    """The SHA-256 of ``path``, from the cache when its size and mtime are unchanged (else computed, cached)."""
    key = str(path.resolve())
    stat = path.stat()
    stamp = [stat.st_size, stat.st_mtime_ns]
    cache = _read_cache()
    entry = cache.get(key)
    if isinstance(entry, list) and entry[:2] == stamp and len(entry) == 3:
        return str(entry[2])
    digest = sha256_of(path)
    cache[key] = [*stamp, digest]
    _write_cache(cache)
    return digest


def _read_cache() -> dict[str, list[object]]:
    try:
        loaded = json.loads((cache_dir() / CACHE_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def _write_cache(cache: dict[str, list[object]]) -> None:
    target = cache_dir() / CACHE_FILE
    temporary = target.with_name(f".{CACHE_FILE}.tmp-{os.getpid()}")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        temporary.write_text(json.dumps(cache))
        os.replace(temporary, target)
    except OSError:
        temporary.unlink(missing_ok=True)


__all__ = ["CACHE_ENV", "cache_dir", "file_sha256", "sha256_of"]
