"""The mutation harness (``make test-mutations``, tools/mutations): its list is well formed and covers the core,
and a mutation whose snippet is not in its file exactly once is an error, never a pass. (The harness itself
runs the mutations; this only checks what it would run.)"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.helpers.paths import REPO


def _harness() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mutation_harness", REPO / "tools" / "mutations" / "run.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_every_mutation_names_a_behaviour_existing_tests_and_a_snippet_found_once() -> None:
    harness = _harness()
    mutations = harness.load()
    assert len(mutations) >= 25
    for m in mutations:
        assert m.behaviour.strip() and m.tests, m.id
        assert (REPO / m.file).read_text().count(m.original) == 1, (
            f"{m.id}: snippet not in {m.file} exactly once"
        )
        for test in m.tests:
            path, _, name = test.partition("::")
            assert (REPO / path).is_file(), f"{m.id}: no test file {path}"
            assert not name or f"def {name.split('[')[0]}(" in (REPO / path).read_text(), f"{m.id}: {test}"
    covered = {m.file.split("/")[1] for m in mutations}
    assert {"attention", "quantize", "nn", "data", "models", "run"} <= covered


def test_every_parametrized_test_a_mutation_names_is_one_pytest_collects() -> None:
    """A named case (``test_x[ids]``) whose parameters changed since is no test pytest runs: the harness's baseline
    then refuses the whole run (two mutations named a case of six parameters after the test took a seventh)."""
    import subprocess

    named = {test for m in _harness().load() for test in m.tests if "[" in test}
    files = sorted({test.partition("::")[0] for test in named})
    collected = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *files],
        cwd=REPO, capture_output=True, text=True,
    ).stdout  # fmt: skip
    assert not named - {line.strip() for line in collected.splitlines()}


@pytest.mark.parametrize("copies", [0, 2])
def test_a_snippet_not_found_exactly_once_is_an_error(tmp_path: Path, copies: int) -> None:
    harness = _harness()
    (tmp_path / "core.py").write_text("x = 1\n" * copies)
    mutation = harness.Mutation("m", "core.py", "x = 1", "x = 2", "x is 2", ("tests/none.py",))
    outcome = harness.check(tmp_path, mutation)
    assert outcome.status == "ERROR" and f"{copies} times" in outcome.detail
    assert (tmp_path / "core.py").read_text() == "x = 1\n" * copies  # nothing planted


@pytest.mark.parametrize("preset", [None, "/elsewhere"])
def test_the_copied_tree_reads_the_repositorys_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, preset: str | None
) -> None:
    """A copy of the tree lies away from ../shared: its tests get the repository's data folder, unless the caller set
    one (``make test-mutations`` does)."""
    harness = _harness()
    shared = tmp_path / "shared" / "datasets"
    shared.mkdir(parents=True)
    monkeypatch.setattr(harness, "SHARED_DATA", shared)
    if preset is None:
        monkeypatch.delenv("TVQ_DATA_DIR", raising=False)
    else:
        monkeypatch.setenv("TVQ_DATA_DIR", preset)
    test = tmp_path / "tree" / "test_data_dir.py"
    test.parent.mkdir()
    test.write_text(
        f"import os\n\ndef test_it():\n    assert os.environ['TVQ_DATA_DIR'] == {str(preset or shared)!r}\n"
    )
    status, output, timed_out = harness.run_tests(test.parent, ("test_data_dir.py",))
    assert (status, timed_out) == (0, False), output
