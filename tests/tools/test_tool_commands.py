"""The commands the docs print for the scripts under ``tools/`` run as printed: a script that imports the ``tools``
package runs as ``python -m tools.<folder>.<name>`` from the repository root (run by its path, Python puts its own
folder on ``sys.path``, not the root, and ``from tools...`` fails)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.helpers.paths import REPO

BY_PATH = re.compile(r"python (tools/[\w/]+\.py)")
AS_MODULE = re.compile(r"python -m (tools(?:\.\w+)+)")


def documents() -> list[Path]:
    """README.md, docs/*.md, and the Markdown files and scripts under tools/."""
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "tools").rglob("*.md")),
            *sorted((REPO / "tools").rglob("*.py"))]  # fmt: skip


def imports_tools(script: Path) -> bool:
    return re.search(r"^(from|import) tools\b", script.read_text(), re.M) is not None


def test_no_document_runs_by_its_path_a_script_that_imports_the_tools_package() -> None:
    wrong = sorted(
        f"{doc.relative_to(REPO)}: python {path}"
        for doc in documents()
        for path in BY_PATH.findall(doc.read_text())
        if (REPO / path).is_file() and imports_tools(REPO / path)
    )
    assert not wrong, (
        "these fail with ModuleNotFoundError: print them as python -m tools.<folder>.<name>:\n"
        + "\n".join(wrong)
    )


def test_every_printed_module_command_names_a_script_that_exists() -> None:
    printed = {name for doc in documents() for name in AS_MODULE.findall(doc.read_text())}
    assert "tools.vq_cache_learning.collisions" in printed
    missing = sorted(name for name in printed if not (REPO / (name.replace(".", "/") + ".py")).is_file())
    assert not missing, f"no such script: {missing}"


def test_a_module_command_imports_the_tools_package_where_its_path_does_not() -> None:
    script = REPO / "tools" / "vq_cache_learning" / "collisions.py"
    assert imports_tools(script)
    as_module = subprocess.run([sys.executable, "-m", "tools.vq_cache_learning.collisions", "--help"],
                               cwd=REPO, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert as_module.returncode == 0 and as_module.stdout.startswith("usage: collisions.py"), as_module.stderr
    by_path = subprocess.run([sys.executable, str(script), "--help"], cwd=REPO, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert by_path.returncode != 0 and "No module named 'tools'" in by_path.stderr
