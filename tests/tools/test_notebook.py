"""``notebooks/compare_runs.ipynb`` executes on a small real sweep and produces its plots."""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from tests.helpers.sweeps import GROUP, REPO, make_small_sweep

NOTEBOOK = REPO / "notebooks" / "compare_runs.ipynb"


@pytest.fixture
def small_sweep(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> Path:
    """The shared small sweep (see ``sweep_fixture``)."""
    return make_small_sweep(tmp_path_factory.getbasetemp())


@GROUP
def test_compare_runs_notebook_executes_and_plots(small_sweep: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TVQ_SWEEP_DIR", str(small_sweep))
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(
        notebook, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(REPO)}}
    ).execute()
    outputs = [
        output for cell in notebook.cells if cell.cell_type == "code" for output in cell.get("outputs", [])
    ]
    assert not [o for o in outputs if o.output_type == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs)
    assert any("text/html" in o.get("data", {}) for o in outputs), "the run table is displayed"
    assert os.environ["TVQ_SWEEP_DIR"] in "".join(o.get("text", "") for o in outputs)
