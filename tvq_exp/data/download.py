"""HTTP downloads with a progress bar, atomic writes (``*.part`` then rename) and checksum checks."""

from __future__ import annotations

import hashlib
import http.client
import os
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from tvq_exp.data.paths import CorruptFileError, DataNotFoundError

CHUNK = 1 << 20


class ChecksumError(CorruptFileError):
    """A file's digest differs from the expected one; the message names the file, expected and actual."""


def digest_file(path: Path, algorithm: str = "md5") -> str:
    """Hex digest of a file, read in chunks."""
    hasher = hashlib.new(algorithm)
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK):
            hasher.update(chunk)
    return hasher.hexdigest()


def digest_bytes(data: bytes | memoryview, algorithm: str = "md5") -> str:
    """Hex digest of an in-memory buffer."""
    return hashlib.new(algorithm, data).hexdigest()


def check_digest(name: str | Path, actual: str, expected: str, algorithm: str = "md5") -> None:
    """Raise :class:`ChecksumError` when ``actual`` differs from ``expected`` (case-insensitive)."""
    if actual.lower() != expected.lower():
        raise ChecksumError(
            f"{algorithm} mismatch for {name}: expected {expected.lower()}, got {actual.lower()}. "
            "The file is corrupt, truncated or a different version; delete it and fetch it again."
        )


def verify_file(
    path: Path, md5: str | None = None, sha256: str | None = None, name: str | Path | None = None
) -> None:
    """Check a file against the given md5 and/or sha256 (either may be ``None``)."""
    for algorithm, expected in (("md5", md5), ("sha256", sha256)):
        if expected:
            check_digest(name or path, digest_file(path, algorithm), expected, algorithm)


def download(
    url: str,
    dest: Path,
    *,
    md5: str | None = None,
    sha256: str | None = None,
    validate: Callable[[Path], None] | None = None,
    timeout: float = 60.0,
    progress: bool = True,
) -> Path:
    """Download ``url`` to ``dest`` atomically.

    The bytes go to ``dest.part``; ``md5``/``sha256`` (of the downloaded file) and ``validate(part_path)`` run
    on it; only when all pass is it renamed to ``dest``. On any failure the part file is deleted and no
    ``dest`` appears, nor any folder it created for it. Network failures raise :class:`DataNotFoundError` saying where to put the file by hand.
    """
    created = [folder for folder in (dest.parent, *dest.parent.parents) if not folder.exists()]
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    try:
        _fetch(url, part, timeout=timeout, progress=progress)
        verify_file(part, md5=md5, sha256=sha256, name=f"{dest} (downloaded from {url})")
        if validate is not None:
            validate(part)
    except BaseException:
        part.unlink(missing_ok=True)
        for folder in created:  # deepest first: a failed download leaves the data root as it found it
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
        raise
    os.replace(part, dest)
    return dest


def _fetch(url: str, part: Path, *, timeout: float, progress: bool) -> None:
    """Stream ``url`` into ``part`` with a rich progress bar; check the length when the server sends one."""
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
    )
    try:
        response = urllib.request.urlopen(url, timeout=timeout)
    except (urllib.error.URLError, OSError) as error:
        raise DataNotFoundError(
            f"could not download {url} ({error}). Fix: download it by hand and put it at "
            f"{part.with_suffix('')}, or check the URL and your network."
        ) from error
    received = 0
    with response, open(part, "wb") as out, Progress(*columns, disable=not progress) as bar:
        total = int(response.headers.get("Content-Length") or 0) or None
        task = bar.add_task(f"download {part.with_suffix('').name}", total=total)
        try:
            while chunk := response.read(CHUNK):
                out.write(chunk)
                received += len(chunk)
                bar.advance(task, len(chunk))
        except http.client.IncompleteRead as error:
            raise CorruptFileError(f"download of {url} was truncated ({error})") from error
    if total is not None and received != total:
        raise CorruptFileError(f"download of {url} was truncated: got {received} of {total} bytes")
