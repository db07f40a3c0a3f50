"""Reading byte corpora from files and splitting them.

Every split is a 1-D ``np.uint8`` array: a read-only ``np.memmap`` for a raw single file, or one buffer
(``np.frombuffer`` / ``np.empty`` filled by ``readinto``) for compressed files and concatenated folders.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import os
import shutil
import zipfile
import zlib
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path

import numpy as np

from tvq_exp.data.content import ALGORITHM, check_content, content_digest
from tvq_exp.data.digests import file_sha256
from tvq_exp.data.paths import CorruptFileError
from tvq_exp.data.text.corpus import Splits

ZIP_MAGIC = b"PK\x03\x04"
GZIP_MAGIC = b"\x1f\x8b"
SNIFF_BYTES = 1 << 16  # how much of a text corpus file check_text looks at
CONTROL_BYTES = np.array([b for b in range(32) if b not in (9, 10, 12, 13)] + [127], dtype=np.uint8)
MAX_CONTROL = 0.01
ENWIK_HELD_OUT = 5_000_000
ENWIK_FULL_SIZE = 100_000_000


# ----------------------------------------------------------------------------------------------- reading


def read_bytes(path: Path) -> np.ndarray:
    """Bytes of a raw, ``.zip`` (single member) or ``.gz`` file as a 1-D ``np.uint8`` array.

    The format is detected from the magic number, so ``*.part`` files work too. Raw files are memory-mapped.
    A truncated or corrupt archive raises :class:`CorruptFileError` naming the file.
    """
    with open(path, "rb") as handle:
        magic = handle.read(4)
    try:
        if magic == ZIP_MAGIC:
            return np.frombuffer(_read_zip_member(path), dtype=np.uint8)
        if magic[:2] == GZIP_MAGIC:
            with gzip.open(path, "rb") as handle:
                return np.frombuffer(handle.read(), dtype=np.uint8)
    except (zipfile.BadZipFile, EOFError, zlib.error, gzip.BadGzipFile) as error:
        raise CorruptFileError(
            f"{path} is truncated or corrupt ({type(error).__name__}: {error}); delete it and fetch it again"
        ) from error
    if path.stat().st_size == 0:
        return np.zeros(0, dtype=np.uint8)
    return np.memmap(path, dtype=np.uint8, mode="r")


def check_text(data: np.ndarray | bytes, path: Path) -> None:
    """Refuse a corpus file whose first :data:`SNIFF_BYTES` (after decompression) are not text: a NUL byte, or
    more than :data:`MAX_CONTROL` of control bytes other than tab, newline, carriage return and form feed (a
    binary file, or a compressed one without its ``.gz`` / ``.zip`` name)."""
    head = np.frombuffer(bytes(data[:SNIFF_BYTES]), dtype=np.uint8)
    if not len(head):
        return
    nul = np.flatnonzero(head == 0)
    control = np.isin(head, CONTROL_BYTES).mean()
    if len(nul) or control > MAX_CONTROL:
        what = f"a NUL byte at offset {int(nul[0])}" if len(nul) else f"{control:.0%} control bytes"
        raise CorruptFileError(
            f"{path} is not text ({what} in its first {len(head)} bytes): a binary or compressed file; "
            "point data.corpus.path at text (a .gz or .zip corpus must keep its suffix)"
        )


def _read_zip_member(path: Path) -> bytes:
    """The single file inside a zip archive (CRC-checked by :mod:`zipfile`)."""
    with zipfile.ZipFile(path) as archive:
        members = [info for info in archive.infolist() if not info.is_dir()]
        if len(members) != 1:
            names = [info.filename for info in members]
            raise CorruptFileError(f"{path} should hold exactly one file, found {names}")
        return archive.read(members[0])


def concat_files(files: Sequence[Path], separator: bytes, cache: Path | None = None) -> np.ndarray:
    """Concatenate ``files`` with ``separator`` between them into one ``np.uint8`` array.

    With ``cache`` (a path inside the data root), the concatenation is written once to a file whose name
    carries a fingerprint of the inputs' contents (names and SHA-256, :func:`~tvq_exp.data.digests.file_sha256`:
    hashed once per file, cached by size and mtime) and memory-mapped afterwards, so an edited input (even of the
    same size) gets a new concatenation; when that location is not writable it falls back to memory. The
    concatenation's content digest (``<file>.xxh3_64``, :mod:`tvq_exp.data.content`) is checked on each open: a
    concatenation edited in place is refused in one line.
    """
    sizes = [path.stat().st_size for path in files]
    total = sum(sizes) + len(separator) * max(len(files) - 1, 0)
    if cache is not None:
        cached = _cached_concat(files, sizes, total, separator, cache)
        if cached is not None:
            return cached
    out = np.empty(total, dtype=np.uint8)
    view = memoryview(out)
    position = 0
    for index, (path, size) in enumerate(zip(files, sizes, strict=True)):
        if index:
            view[position : position + len(separator)] = separator
            position += len(separator)
        with open(path, "rb") as handle:
            if handle.readinto(view[position : position + size]) != size:
                raise CorruptFileError(f"{path} changed size while being read")
        position += size
    return out


def _cached_concat(
    files: Sequence[Path], sizes: Sequence[int], total: int, separator: bytes, cache: Path
) -> np.ndarray | None:
    """Memory-map (building it first if needed) the fingerprinted concatenation; ``None`` if unwritable."""
    fingerprint = hashlib.sha256(
        json.dumps(
            [[path.name, size, file_sha256(path)] for path, size in zip(files, sizes, strict=True)]
            + [separator.hex()]
        ).encode()
    ).hexdigest()[:16]
    target = cache.with_name(f"{cache.name}-{fingerprint}.bin")
    recorded = target.with_name(target.name + f".{ALGORITHM}")
    if not (target.is_file() and recorded.is_file() and target.stat().st_size == total):
        try:
            _write_concat(files, separator, target)
            recorded.write_text(content_digest(target))
        except OSError:
            return None
    check_content(target, recorded.read_text().strip(), f"delete it to build it again from {files[0].parent}")
    return np.memmap(target, dtype=np.uint8, mode="r") if total else np.zeros(0, dtype=np.uint8)


def _write_concat(files: Sequence[Path], separator: bytes, target: Path) -> None:
    """Stream the concatenation to ``target`` atomically."""
    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.with_name(target.name + ".part")
    try:
        with open(part, "wb") as out:
            for index, path in enumerate(files):
                if index:
                    out.write(separator)
                with open(path, "rb") as handle:
                    shutil.copyfileobj(handle, out, 1 << 20)
        os.replace(part, target)
    finally:
        part.unlink(missing_ok=True)


def check_text_files(files: Sequence[Path]) -> None:
    """:func:`check_text` on the first bytes of each raw file."""
    for path in files:
        with open(path, "rb") as handle:
            check_text(handle.read(SNIFF_BYTES), path)


def text_files(folder: Path, suffixes: Sequence[str]) -> list[Path]:
    """Regular, non-hidden files under ``folder`` (recursive) with one of ``suffixes``, sorted by relative path."""
    found = [
        path
        for path in folder.rglob("*")
        if path.is_file()
        and path.suffix in suffixes
        and not any(part.startswith(".") for part in path.relative_to(folder).parts)
    ]
    return sorted(found, key=lambda path: path.relative_to(folder).as_posix())


# ----------------------------------------------------------------------------------------------- splitting


def split_fractions(data: np.ndarray, val_fraction: float, test_fraction: float) -> Splits:
    """Contiguous split: train first, then validation, then test, sized by fraction of ``len(data)``.

    Train gets ``floor(n * (1 - val - test))`` bytes (exact rational arithmetic, so 90% of 1,115,394 is
    1,003,854), test ``floor(n * test)``, validation the rest. With ``test_fraction == 0`` the test split *is*
    the validation split (same bytes).
    """
    n = len(data)
    val, test = Fraction(str(val_fraction)), Fraction(str(test_fraction))
    train_end = math.floor(n * (1 - val - test))
    test_start = n - math.floor(n * test)
    validation = data[train_end:test_start]
    return {
        "train": data[:train_end],
        "validation": validation,
        "test": data[test_start:] if test else validation,
    }


def split_held_out(data: np.ndarray) -> Splits:
    """The enwik8/text8 split: for >= 100M bytes the last 10M bytes are 5M validation + 5M test
    (90M/5M/5M for the real file); smaller files get 90%/5%/5%."""
    n = len(data)
    held = ENWIK_HELD_OUT if n >= ENWIK_FULL_SIZE else n // 20
    return {
        "train": data[: n - 2 * held],
        "validation": data[n - 2 * held : n - held],
        "test": data[n - held :],
    }
