"""Mutation check of the core (``make test-mutations``): plant each mutation of ``mutations.yaml`` in a copy of
the tree, one at a time, run the tests that should catch it, and expect them to fail.

Each entry names a ``file``, an ``original`` snippet found there exactly once, the ``mutant`` that replaces it,
the ``behaviour`` the mutation breaks and the ``tests`` (pytest node ids) that guard it. A
snippet found zero times or more than once is an error, as is a test run that errs instead of failing
(collection or usage errors, a timeout): only failing tests count as catching. All the named tests first run
once together without any mutation, and must pass.

The tree (git's tracked and untracked, not ignored, files) is copied into one temporary folder per worker, so
the working tree is never touched; ``--jobs`` workers (default 2) take the mutations in turn. Prints a table
(mutation, behaviour, the test that caught it, seconds) and exits 1 unless every mutation was caught.

    python tools/mutations/run.py [--only ID ...] [--jobs N] [--list]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from queue import Queue

import yaml

REPO = Path(__file__).resolve().parents[2]
LIST = Path(__file__).with_name("mutations.yaml")
TIMEOUT = 600  # seconds per mutation's test run
# seconds for the baseline, which runs every named test at once (about 380: past 600 s on two cores, 2026-11-30)
BASELINE_TIMEOUT = 3600
# the real data the tests read: a copy of the tree lies elsewhere, so the tests' own default (the repository's
# ../shared/datasets, as tests/conftest.py finds it) is resolved here, from the repository
SHARED_DATA = REPO.parent / "shared" / "datasets"
FAILED = re.compile(r"^(?:FAILED|ERROR) (\S+)", re.MULTILINE)


@dataclass(frozen=True)
class Mutation:
    """One planted bug: ``original`` in ``file`` becomes ``mutant``, which ``tests`` should catch."""

    id: str
    file: str
    original: str
    mutant: str
    behaviour: str
    tests: tuple[str, ...]


@dataclass
class Outcome:
    mutation: Mutation
    status: str  # caught | SURVIVED | ERROR
    detail: str
    seconds: float
    output: str = ""


def load(path: Path = LIST) -> list[Mutation]:
    """The mutations of ``path``, checked for their fields and unique ids."""
    entries = yaml.safe_load(path.read_text())
    fields = {"id", "file", "original", "mutant", "behaviour", "tests"}
    mutations = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or set(entry) != fields:
            raise SystemExit(f"error: {path.name} entry {i} must have exactly the fields {sorted(fields)}")
        if entry["original"] == entry["mutant"]:
            raise SystemExit(f"error: {path.name} entry {entry['id']}: the mutant is the original")
        mutations.append(Mutation(**{**entry, "tests": tuple(entry["tests"])}))
    ids = [m.id for m in mutations]
    if len(set(ids)) != len(ids):
        raise SystemExit(f"error: {path.name} has duplicate ids")
    return mutations


def tree_files() -> list[str]:
    """The tree as git sees it: tracked and untracked files, ignored ones left out."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, check=True, capture_output=True,
    ).stdout.decode()  # fmt: skip
    return [f for f in listed.split("\0") if f and (REPO / f).is_file()]


def copy_tree(files: list[str], target: Path) -> Path:
    for name in files:
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, target / name)
    return target


def run_tests(tree: Path, tests: tuple[str, ...], timeout: float = TIMEOUT) -> tuple[int, str, bool]:
    """``(exit status, output, timed out)`` of the tests in ``tree``, stopping at the first failure or after
    ``timeout`` seconds."""
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    if "TVQ_DATA_DIR" not in env and SHARED_DATA.is_dir():
        env["TVQ_DATA_DIR"] = str(SHARED_DATA)
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-o", "addopts=-ra"]
    try:
        proc = subprocess.run(
            [*command, *tests], cwd=tree, env=env, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired as expired:
        out = expired.stdout or b""
        return -1, out.decode() if isinstance(out, bytes) else out, True
    return proc.returncode, proc.stdout + proc.stderr, False


def plant(tree: Path, mutation: Mutation) -> str | None:
    """Write the mutant into ``tree``; the original text to restore, or None (and nothing written) when the
    snippet is not found exactly once."""
    path = tree / mutation.file
    if not path.is_file():
        return None
    text = path.read_text()
    if text.count(mutation.original) != 1:
        return None
    path.write_text(text.replace(mutation.original, mutation.mutant))
    return text


def check(tree: Path, mutation: Mutation) -> Outcome:
    start = time.monotonic()
    original = plant(tree, mutation)
    if original is None:
        found = (
            (tree / mutation.file).read_text().count(mutation.original)
            if (tree / mutation.file).is_file()
            else 0
        )
        return Outcome(mutation, "ERROR", f"its snippet is in {mutation.file} {found} times, not once", 0.0)
    try:
        status, output, timed_out = run_tests(tree, mutation.tests)
    finally:
        (tree / mutation.file).write_text(original)
    seconds = time.monotonic() - start
    if timed_out:
        return Outcome(mutation, "ERROR", f"tests ran past {TIMEOUT} s", seconds)
    if status == 0:
        return Outcome(mutation, "SURVIVED", "the tests passed", seconds)
    failed = FAILED.search(output)
    if status == 1 and failed:
        return Outcome(mutation, "caught", failed.group(1), seconds, output)
    tail = " | ".join(output.strip().splitlines()[-3:])
    return Outcome(mutation, "ERROR", f"pytest exit {status}, not a test failure: {tail}", seconds)


def baseline(tree: Path, mutations: list[Mutation]) -> None:
    """The named tests pass on the unmutated tree (else a failure proves nothing)."""
    tests = tuple(dict.fromkeys(t for m in mutations for t in m.tests))
    start = time.monotonic()
    status, output, timed_out = run_tests(tree, tests, BASELINE_TIMEOUT)
    if status != 0:
        tail = "\n".join(output.strip().splitlines()[-15:])
        raise SystemExit(
            f"error: without any mutation the named tests do not all pass "
            f"({f'past {BASELINE_TIMEOUT} s' if timed_out else f'exit {status}'}):\n{tail}"
        )
    print(f"baseline: the {len(tests)} named tests pass without mutations ({time.monotonic() - start:.0f} s)")


def table(outcomes: list[Outcome]) -> str:
    rows = ["| mutation | behaviour it breaks | caught by | s |", "|---|---|---|---|"]
    for o in outcomes:
        where = o.detail if o.status == "caught" else f"**{o.status}**: {o.detail}"
        rows.append(f"| `{o.mutation.id}` | {o.mutation.behaviour} | {where} | {o.seconds:.0f} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", metavar="ID", help="run these mutations only")
    parser.add_argument("--jobs", type=int, default=2, help="workers, each with its own copy (default 2)")
    parser.add_argument("--no-baseline", action="store_true", help="skip the unmutated run of the tests")
    parser.add_argument("--list", action="store_true", help="list the mutations and exit")
    parser.add_argument("--show", action="store_true", help="print each catching failure's assertion lines")
    args = parser.parse_args(argv)
    mutations = load()
    if args.only:
        unknown = set(args.only) - {m.id for m in mutations}
        if unknown:
            raise SystemExit(f"error: no mutation {sorted(unknown)}; see --list")
        mutations = [m for m in mutations if m.id in args.only]
    if args.list:
        for m in mutations:
            print(f"{m.id}: {m.file}: {m.behaviour}")
        return 0
    files = tree_files()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tvq-mutations-") as scratch:
        trees: Queue[Path] = Queue()
        for i in range(max(1, args.jobs)):
            trees.put(copy_tree(files, Path(scratch) / f"tree{i}"))
        if not args.no_baseline:
            baseline(trees.queue[0], mutations)

        def one(mutation: Mutation) -> Outcome:
            tree = trees.get()
            try:
                outcome = check(tree, mutation)
            finally:
                trees.put(tree)
            print(f"{outcome.status:8} {mutation.id} ({outcome.seconds:.0f} s) {outcome.detail}", flush=True)
            if args.show:
                asserted = [line for line in outcome.output.splitlines() if line.startswith("E ")][:6]
                print("".join(f"    {line}\n" for line in asserted), end="", flush=True)
            return outcome

        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            outcomes = list(pool.map(one, mutations))
    print()
    print(table(outcomes))
    caught = sum(o.status == "caught" for o in outcomes)
    print(f"\n{caught}/{len(outcomes)} caught in {time.monotonic() - started:.0f} s")
    return 0 if caught == len(outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
