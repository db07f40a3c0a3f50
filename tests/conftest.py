"""Shared test settings: deterministic seeds, the shared data root, and small helpers."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.helpers.data import check_data_mark, missing_data
from tests.helpers.interpreter import quicken

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "datasets"

if "TVQ_DATA_DIR" not in os.environ and SHARED_DATA.is_dir():
    os.environ["TVQ_DATA_DIR"] = str(SHARED_DATA)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "needs_data(*paths): real data under TVQ_DATA_DIR; missing: fails in CI, else skips (reason shown)",
    )
    quicken()  # Triton's interpreter without two of its costs (tests/helpers/interpreter.py)


def pytest_runtest_setup(item: pytest.Item) -> None:
    check_data_mark(item)


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture(autouse=True, scope="session")
def _one_thread() -> Iterator[None]:
    """One torch thread per test process: ``make test`` runs two workers on two cores, and a single
    thread is also bit-for-bit repeatable (exact-resume checks)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The shared real-data root (``TVQ_DATA_DIR``)."""
    root = Path(os.environ.get("TVQ_DATA_DIR", SHARED_DATA))
    if not root.is_dir():
        missing_data("the data root itself")
    return root
