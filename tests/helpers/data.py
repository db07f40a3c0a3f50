"""What a test does when the real data it needs is missing: in CI (``CI`` set, as CI services do) it fails,
naming what is missing; on a machine without the shared datasets it skips with that reason, listed in the
run's summary (``-ra``). Never a silent pass."""

from __future__ import annotations

import os
from pathlib import Path
from typing import NoReturn

import pytest

SHARED_DATA = Path(__file__).resolve().parents[2].parent / "shared" / "datasets"


def in_ci() -> bool:
    """Whether this run is CI's (``CI`` set to anything but empty, ``0`` or ``false``)."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false")


def data_root() -> Path:
    """``TVQ_DATA_DIR``, else the shared datasets folder next to the repository."""
    return Path(os.environ.get("TVQ_DATA_DIR") or SHARED_DATA)


def missing_data(what: str) -> NoReturn:
    """Fail in CI, else skip, saying that ``what`` is missing from the data root."""
    message = f"{what} is not in TVQ_DATA_DIR={data_root()} (the shared datasets folder)"
    if in_ci():
        pytest.fail(f"{message}: CI must provide it", pytrace=False)
    pytest.skip(message)


def check_data_mark(item: pytest.Item) -> None:
    """``@pytest.mark.needs_data("text/gutenberg", ...)``: each path must exist under the data root."""
    for mark in item.iter_markers("needs_data"):
        missing = [p for p in mark.args if not (data_root() / p).exists()]
        if missing:
            missing_data(", ".join(missing))


def shipped_text(folder: Path) -> Path:
    """A text corpus from files the repository ships (README, CONTRIBUTING, docs/*.md; about 360 kB), written to
    ``folder / "shipped.txt"``: for training tests that need real text but not a particular corpus."""
    repo = Path(__file__).resolve().parents[2]
    sources = [repo / "README.md", repo / "CONTRIBUTING.md", *sorted((repo / "docs").glob("*.md"))]
    target = folder / "shipped.txt"
    target.write_bytes(b"\n".join(path.read_bytes() for path in sources))
    return target
