"""Docs that cannot rot: every repository path, test and module the docs cite exists; every preset of the
main config groups is named in the README's table; measured timings live in docs/benchmarks.md only.

The checks read the tree as it is (no list of files here), so moving a module or adding a preset without
updating the docs fails them."""

from __future__ import annotations

import ast
import re
import subprocess
from functools import cache
from pathlib import Path

import pytest

from tests.helpers.paths import CONF, REPO

DOCS = sorted([REPO / "README.md", REPO / "CONTRIBUTING.md", *(REPO / "docs").glob("*.md")])
TOP = ("tvq_exp", "tests", "conf", "docs", "tools", "notebooks", "studies", ".ci")
# a path-like token: starts at a top-level folder (or is a root file), no placeholders, globs or options
FOLDERS = "|".join(re.escape(t) for t in TOP)
PATH = re.compile(
    rf"(?<![\w./<-])((?:{FOLDERS})/[\w./<>*{{}}-]*[\w/>*}}]|(?:train|eval|sample)\.py|Makefile|pyproject\.toml)"
    r"(::[\w\[\]-]+)?"
)
MODULE = re.compile(r"(?<![\w./-])(tvq_exp(?:\.\w+)+)")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
PLACEHOLDER = re.compile(r"[<>*{}]|\.\.\.|NAME|/X\b")
OUTPUT = re.compile(r"(--(?:out|json|plot|figures|output)[ =]|\boutput=)\S+")  # what a command will write


def cited_paths(doc: Path) -> set[str]:
    text = OUTPUT.sub("", doc.read_text())
    found = {m.group(1) + (m.group(2) or "") for m in PATH.finditer(text)}
    for link in LINK.findall(text):
        if not re.match(r"[a-z]+:", link):  # not http:, mailto:
            target = (doc.parent / link).resolve()
            found.add(str(target.relative_to(REPO)) if target.is_relative_to(REPO) else link)
    return {p for p in found if not PLACEHOLDER.search(p)}


@cache
def defined_names(path: Path) -> set[str]:
    """Top-level functions, classes and assignments of a Python file (and methods, by bare name)."""
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.ImportFrom):
            names.update(alias.asname or alias.name for alias in node.names)
    return names


@cache
def ignored_by_git(path: str) -> bool:
    """Whether git ignores ``path`` (relative to the repository): a clean clone does not have it, even where this
    checkout does (a run folder, a checkpoint). False outside a git checkout."""
    run = subprocess.run(["git", "check-ignore", "-q", path], cwd=REPO, capture_output=True)
    return run.returncode == 0


def missing_path(cited: str) -> str | None:
    """Why ``cited`` (``a/b.py``, ``a/b.py::test_x[param]``, ``docs/x.md``) does not exist on a clean clone, or
    None."""
    path, _, test = cited.partition("::")
    target = REPO / path.rstrip("/")
    if not target.exists():
        return f"{path} does not exist"
    if ignored_by_git(path.rstrip("/")):
        return f"{path} is ignored by git: a clean clone does not have it"
    name = test.split("[")[0]
    if name and name not in defined_names(target):
        return f"{path} has no {name}"
    return None


def missing_module(dotted: str) -> str | None:
    """Why ``tvq_exp.a.b[.name]`` names no module (file or package) or no name defined in one, or None."""
    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):
        base = REPO.joinpath(*parts[:split])
        module = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
        if module.is_file():
            rest = parts[split:]
            if not rest or rest[0] in defined_names(module):
                return None
            return f"{dotted}: {'.'.join(parts[:split])} defines no {rest[0]}"
    return f"{dotted}: no such module"


def test_a_cited_path_that_git_ignores_is_refused() -> None:
    """A file this checkout has but git ignores (here under ``outputs/``) is missing from the clean clone CI runs."""
    probe = REPO / "outputs" / "test_docs_probe.txt"
    created = not probe.parent.exists()
    probe.parent.mkdir(exist_ok=True)
    probe.write_text("a run's output")
    try:
        assert missing_path("outputs/test_docs_probe.txt") == (
            "outputs/test_docs_probe.txt is ignored by git: a clean clone does not have it"
        )
        assert missing_path("studies/codebooks/results") is None  # results are kept (.gitignore's exception)
    finally:
        probe.unlink()
        if created:
            probe.parent.rmdir()


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_cited_path_test_and_module_exists(doc: Path) -> None:
    text = doc.read_text()
    problems = [why for p in sorted(cited_paths(doc)) if (why := missing_path(p))]
    problems += [why for m in sorted(set(MODULE.findall(text))) if (why := missing_module(m))]
    assert not problems, f"{doc.relative_to(REPO)} cites what is not there:\n  " + "\n  ".join(problems)


# Markdown files the tools write (python -m tvq_exp.analysis: report/summary.md, frontier.md; a study's report.md)
WRITTEN_DOCS = {"summary.md", "frontier.md", "report.md"}
MD_NAME = re.compile(r"(?<![\w/.-])([A-Za-z_][\w-]*\.md)\b")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_named_markdown_file_exists(doc: Path) -> None:
    """A page named by its file name alone (``design.md``, ``CONTRIBUTING.md``) is one of the repository's (at the
    top or in docs/), or one the tools write: not a page that was renamed or never written."""
    pages = {p.name for p in [*REPO.glob("*.md"), *(REPO / "docs").glob("*.md")]} | WRITTEN_DOCS
    missing = sorted(set(MD_NAME.findall(doc.read_text())) - pages)
    assert not missing, f"{doc.relative_to(REPO)} names pages that do not exist: {missing}"


def readme_table() -> dict[str, str]:
    """The README's config-group table: group -> its options cell."""
    rows = re.findall(r"^\| `([\w/]+)` \| (.*?) \|", (REPO / "README.md").read_text(), flags=re.M)
    return dict(rows)


# model/attention's row names examples (one preset per backend: a new backend's recipe does not edit the README)
@pytest.mark.parametrize(
    ("group", "every"),
    [("experiment", True), ("model", True), ("model/attention", False), ("sweep", True), ("trainer", True),
     ("logger", True), ("callbacks", True), ("codebook", True), ("debug", True), ("hparams_search", True)],
)  # fmt: skip
def test_every_preset_is_named_in_the_readme_table(group: str, every: bool) -> None:
    table = readme_table()
    assert group in table, f"README's config-group table has no row for `{group}`"
    named = set(re.findall(r"`([\w.-]+)`", table[group])) - {"BACKENDS"}
    presets = {p.stem for p in (CONF / group).glob("*.yaml")}
    assert presets, f"conf/{group} has no presets"
    assert not (every and presets - named), f"README's `{group}` row lacks {sorted(presets - named)}"
    assert not named - presets, f"README's `{group}` row names {sorted(named - presets)}, not in conf/{group}"


# a measured duration or rate: "~3 min", "9 min 44 s", "18 min", "87 ms", "1923 tokens/s", "4.6k tokens/s"
TIMING = re.compile(r"(~|\b)\d[\d.,]*k? ?(?:min|minutes|ms|seconds|hours|tokens/s|tok/s|s\b)(?![-\w])")
TIMING_HOME = REPO / "docs" / "benchmarks.md"


@pytest.mark.parametrize("doc", [REPO / "README.md", REPO / "docs" / "images.md"], ids=lambda p: p.name)
def test_timing_claims_live_in_benchmarks_md(doc: Path) -> None:
    text = doc.read_text()
    claims = [
        line.strip()
        for line in text.splitlines()
        if TIMING.search(line) and not line.lstrip().startswith(("python ", "make ", "$ "))
    ]
    assert not claims, (
        f"{doc.name} states timings; put them in docs/benchmarks.md and point there:\n" + "\n".join(claims)
    )
    assert "docs/benchmarks.md" in text or "benchmarks.md" in text


def test_benchmarks_md_gives_command_and_machine_state_for_each_timing_section() -> None:
    problems = []
    for section in re.split(r"^## ", TIMING_HOME.read_text(), flags=re.M)[1:]:
        title = section.splitlines()[0]
        if TIMING.search(section) and not title.startswith(("GPU path", "The VQ path")):
            if not re.search(r"```\w*\n(python|make|time|\.venv/bin/python|PYTHONPATH)", section):
                problems.append(f"{title}: no command")
            if not re.search(r"\b(idle|shared|busy)\b", section):
                problems.append(f"{title}: no machine state (idle or shared)")
    assert not problems, "\n".join(problems)
