"""Where data lives: the data root, path resolution and the errors raised for missing or broken files."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path

ENV_VAR = "TVQ_DATA_DIR"
DEFAULT_ROOT = "data"


class DataNotFoundError(FileNotFoundError):
    """A dataset file or folder is missing; the message says what, where it was looked for, and how to fix it."""


class CorruptFileError(ValueError):
    """A dataset file exists but cannot be used (truncated archive, wrong size or shape, bad header)."""


def data_root(root: str | os.PathLike[str] | None = None) -> Path:
    """The data root: ``root`` when given, else ``$TVQ_DATA_DIR``, else ``./data`` (absolute)."""
    chosen = root if root not in (None, "") else os.environ.get(ENV_VAR) or DEFAULT_ROOT
    return Path(chosen).expanduser().resolve()


def resolve(path: str | os.PathLike[str], root: Path) -> Path:
    """``path`` itself when absolute, else ``root / path``."""
    candidate = Path(path).expanduser()
    return candidate if candidate.is_absolute() else root / candidate


def first_file(candidates: Iterable[Path]) -> Path | None:
    """The first candidate that is an existing regular file, or ``None``."""
    return next((path for path in candidates if path.is_file()), None)


def not_found(what: str, looked_for: Sequence[Path], fix: str, root: Path) -> DataNotFoundError:
    """Build a :class:`DataNotFoundError` listing every path looked at and the fix."""
    lines = [f"{what} not found. Looked for:"]
    lines += [f"  - {path}" for path in looked_for]
    lines.append(f"Fix: {fix}")
    lines.append(f"(data root: {root}; set {ENV_VAR} to the folder that holds your datasets to change it)")
    return DataNotFoundError("\n".join(lines))
