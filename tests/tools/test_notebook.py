"""``notebooks/compare_runs.ipynb`` executes on a small real sweep and produces its plots."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from tests.helpers.sweeps import GROUP, OK_JOBS, REPO, SWEEP_VALUES, make_small_sweep
from tvq_exp import analysis

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
    NotebookClient(  # in notebooks/, Jupyter's working directory for it
        notebook, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOK.parent)}}
    ).execute()
    by_cell = {
        i: cell.get("outputs", []) for i, cell in enumerate(notebook.cells) if cell.cell_type == "code"
    }
    assert not [o for outs in by_cell.values() for o in outs if o.output_type == "error"]
    (summary,) = by_cell[1]
    assert summary.text == f"{len(OK_JOBS)} runs in {small_sweep}; swept: ['model.attention.codebook_size']\n"
    # the run table: one row per job, with the values the job itself recorded in finished.json
    (shown,) = by_cell[3]
    rows = shown.data["text/html"].split("<tbody>")[1].split("</tr>")[:-1]
    assert len(rows) == len(OK_JOBS)
    for job, size in zip(OK_JOBS, SWEEP_VALUES, strict=True):
        finished = json.loads((small_sweep / job / "finished.json").read_text())
        cells = re.findall(r"<td>(.*?)</td>", rows[int(job)])
        assert cells[:3] == [str(size), "ok", str(finished["global_step"])]
        assert f"{finished['val']['bpb']:.6f}" in cells, "the final val/bpb the run recorded"
    # bpb against step and wall time (one figure, two panels), then one panel per swept key
    figures = [
        (i, o.data["text/plain"])
        for i, outs in by_cell.items()
        for o in outs
        if "image/png" in o.get("data", {})
    ]
    assert figures == [(5, "<Figure size 1100x400 with 2 Axes>"), (6, "<Figure size 500x400 with 1 Axes>")]


def test_latest_sweep_is_found_from_notebooks_and_is_the_newest_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From ``notebooks/`` (Jupyter's working directory) the repository's ``logs/`` is found; the newest sweep is
    the last written, not the last by name (a named sweep sorted after every timestamp)."""
    sweeps = tmp_path / "logs" / "multiruns"
    for age, name in ((300, "zz_named"), (200, "2026-11-27_10-00-00_a1"), (100, "2026-11-27_11-00-00_b2")):
        (sweeps / name / "0").mkdir(parents=True)
        os.utime(sweeps / name, (time.time() - age, time.time() - age))
    (tmp_path / "notebooks").mkdir()
    monkeypatch.chdir(tmp_path / "notebooks")
    assert analysis.latest_sweep() == sweeps / "2026-11-27_11-00-00_b2"
    os.utime(sweeps / "zz_named")  # written again just now
    assert analysis.latest_sweep() == sweeps / "zz_named"
