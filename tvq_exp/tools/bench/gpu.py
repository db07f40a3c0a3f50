"""``make bench-gpu`` (``python -m tvq_exp.tools.bench.gpu --out bench/gpu.json``): the GPU check on one CUDA device,
written to one JSON file, in one device call of at most 8 minutes (one H100).

Sections, in this order, each under its own time budget (``--budgets``, seconds; 180 / 150 / 120 by default, with
the start-up about 7.5 minutes in all):

1. ``attention``: causal attention, bf16, head dim 128, ``S = L = 512``, T = 8k / 32k / 128k with ``B·H·T`` = 512k
   tokens, forward + backward and forward, ms and TFLOP/s of useful work for each kernel: SDPA's flash kernel, VQ's
   Triton kernels eager and compiled, SDPA's cuDNN kernel, dense attention through compiled flex, VQ's plain and
   flex kernels, in that order (:mod:`.gpu_attention`: every case in one worker process, forward + backward first;
   a case past 90 s is stopped and the rest of its kernel skipped); the ceiling is an 8192³ bf16 matmul
   (``mm_tflops``); each record also gives its time over SDPA flash's (``flash_time_ratio``), and VQ's fused layer at
   32k (eager and compiled) its ``profile``: one more call's time by device kernel, each counted once, the share of
   the call's wall clock the device was busy, and the host's ops by their self CPU time (``host``);
2. ``training``: ``experiment=enwik8_paper``'s model and TBPTT shape (48 GAUs, d_model 768, 2048-token updates of
   8192-token sequences) on one GPU, bf16-mixed, the window + cache step by ``--train-kernel`` (``auto``, the
   default: the plain kernel's GEMMs at the GAU's ``d_v = 1536``, see
   :func:`~tvq_exp.attention.vq.fused.support.value_chunks`; ``triton``: the fused kernels), the training step
   compiled (``module.compile``, on with ``trainer=gpu``), for ``--train-seconds`` (90 s) after its compilation
   (``--compile-seconds`` more are allowed for it) on ``--data`` (the Gutenberg books; enwik8 is not on the lent
   machines; the shape, not the corpus, sets the cost) with ``--train-overrides`` after it
   (``module.compile_mode=default``: the step launched by the host, not replayed from the preset's CUDA graphs):
   tokens/s, TFLOP/s, MFU against the measured matmul rate and against the datasheet peak, and peak memory, from
   the throughput callback (:mod:`.gpu_training`), and the step's device profile, whose ``compile`` part says
   whether the step compiled whole (graph breaks, the functions resumed after them, frames compiled per TBPTT
   position). The per-process batch halves from 16 (on a device of at least 120 GB, else 8) until it fits, while time is left; a
   run stopped at the budget still gives the figures of the rows it flushed;
3. ``tests``: every test whose id names ``cuda`` (``pytest -k cuda``), the fused kernels' files first, without the two
   that train a model in a subprocess first (:data:`FIRST_TESTS`, :data:`TEST_SELECTION`). Among them the VQ kernels
   against the plain reference on the device, fp32 within 1e-5 and bf16 within 1e-2 of the reference in fp32, or 1.5
   times the plain kernel's own bf16 error where that is larger. The count of each outcome and the ids of the tests
   that failed, read from pytest's verbose lines as they come, so a run stopped at its budget keeps what finished,
   and each failure's ``reasons`` (its phase and crash message, written as it happens: :mod:`.pytest_reasons`).

The JSON file is rewritten after each section (and within the attention section after each case), so a run cut
short keeps what finished. A section that fails records its ``error`` and the next still runs; the command then
exits 1. Without a CUDA device it prints one line and exits 0, writing nothing.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from tvq_exp.files import write_text
from tvq_exp.tools.bench import pytest_reasons
from tvq_exp.tools.bench.gpu_attention import KERNELS, LENGTHS, attention_section
from tvq_exp.tools.bench.gpu_training import TRAIN_KERNELS, TRAIN_SHAPE, stopped_output, training_section

REPO = Path(__file__).resolve().parents[3]
SECTIONS = ("attention", "training", "tests")
# seconds; with start-up under 8 minutes (one H100, 2026-11-27: the CUDA tests alone took 97 s, the compiled
# paper-size step did not finish its first timed window in 160 s; one H200, 2026-11-28: 130 s of attention measured
# VQ's fused kernel forward + backward at 8k only, and 150 s of training, 60 of them compiling, gave 18 rows)
BUDGETS = {"attention": 180.0, "training": 150.0, "tests": 120.0}
LARGE_MEMORY_GB = 120  # a device this large tries the paper's per-process batch of 16 first
# the tests section's files, most wanted first: the fused kernels against the plain one on the device, the code
# search, the quantiser's pass over its keys, the cache's running means, the interpreter suite compiled for the device
# (an H200's 140 s ran out in 2026-11-28's run over the whole suite in name order, and the selection has grown since);
# then :func:`cuda_test_files`
FIRST_TESTS = (
    "tests/attention/test_vq_triton_cuda.py", "tests/quantize/test_fused_nearest.py",
    "tests/quantize/test_fused_statistics.py", "tests/attention/test_vq_cache_triton.py",
    "tests/attention/test_vq_triton.py",
)  # fmt: skip
# the CUDA tests; not those that train a model in a subprocess first (a documented command, the command-line fuzz):
# minutes of the section's budget for no check of the kernels
TEST_SELECTION = "cuda and not test_doc_commands and not test_fuzz_cli"


def device_info() -> dict[str, Any]:
    """The machine the figures come from."""
    props = torch.cuda.get_device_properties(0)
    return {
        "name": props.name,
        "memory_gb": round(props.total_memory / 2**30, 1),
        "capability": f"{props.major}.{props.minor}",
        "torch": torch.__version__,
        "triton": _triton_version(),  # the compiler of the fused kernels there (make kernel-report-device)
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


def _triton_version() -> str | None:
    """Triton's version, None where it is missing."""
    try:
        import triton
    except ImportError:
        return None
    return triton.__version__


# a verbose pytest line: the test's id, then its outcome (an id may hold spaces: parameters)
VERDICT = re.compile(r"^(\S+\.py::.+?) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)(?: |$)")


def cuda_test_files(root: Path = REPO) -> list[str]:
    """The test files the tests section runs, in order: :data:`FIRST_TESTS`, then every other file of ``root``'s
    ``tests/`` that mentions CUDA, by name (pytest runs files in the order given; a folder would be run in name
    order)."""
    rest = sorted(
        path.relative_to(root).as_posix()
        for path in (root / "tests").rglob("test_*.py")
        if "cuda" in path.read_text(encoding="utf-8")
    )
    return [*FIRST_TESTS, *(path for path in rest if path not in FIRST_TESTS)]


def tests_section(
    budget_s: float, selection: str = TEST_SELECTION, paths: Sequence[str] | None = None
) -> dict[str, Any]:
    """``pytest -k SELECTION`` over ``paths`` (default :func:`cuda_test_files`: the kernels' tests first) within
    ``budget_s``: the count of each outcome and the ids of the tests that failed or errored, read from pytest's
    verbose lines as they come, so a run stopped at its budget still gives what finished; ``error`` when a test
    failed or the budget ran out."""
    command = [sys.executable, "-u", "-m", "pytest", "-v", "-n", "0", "-p", "no:cacheprovider",
               "-p", pytest_reasons.__name__, "-k", selection, "--continue-on-collection-errors",
               *(cuda_test_files() if paths is None else paths)]  # fmt: skip
    stopped = None
    try:
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=budget_s)
        out, returncode = done.stdout, done.returncode
    except subprocess.TimeoutExpired as cut:
        out = stopped_output(cut.stdout)
        returncode, stopped = None, f"stopped at its {budget_s:.0f} s budget"
    outcomes = {
        match[1]: match[2] for match in map(VERDICT.match, out.splitlines()) if match
    }  # the last line of a test id wins (a teardown error follows its pass)
    words = {"passed": "PASSED", "failed": "FAILED", "errors": "ERROR", "skipped": "SKIPPED"}
    counts = {key: sum(o == word for o in outcomes.values()) for key, word in words.items()}
    reasons = dict(line.removeprefix(pytest_reasons.PREFIX).split("\t", 1) for line in out.splitlines()
                   if line.startswith(pytest_reasons.PREFIX) and "\t" in line)  # fmt: skip
    lines = out.strip().splitlines()
    result = {
        "command": "pytest -k " + selection, "returncode": returncode, "tests": len(outcomes), **counts,
        "not_passed": sorted(t for t, o in outcomes.items() if o in ("FAILED", "ERROR")), "reasons": reasons,
        "summary": stopped or (lines[-1] if lines else ""),
    }  # fmt: skip
    if stopped:
        result["error"] = stopped
    elif returncode not in (0, 5):  # 5: no test selected
        result["error"] = f"pytest exited {returncode}: {result['summary']}"
    return result


def write_report(path: Path, sections: dict[str, Any]) -> Path:
    """The sections as one JSON file (atomically)."""
    return write_text(path.name, path.parent, json.dumps(sections, indent=1) + "\n")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tvq_exp.tools.bench.gpu", description=__doc__.split("\n")[0])
    p.add_argument("--out", default="bench/gpu.json", help="the JSON file to write")
    p.add_argument("--lengths", default=",".join(map(str, LENGTHS)), help="attention lengths T")
    p.add_argument("--head-dim", type=int, default=128, help="attention head dim (flash runs up to 256)")
    p.add_argument(
        "--train-seconds", type=float, default=90.0, help="training time measured, after compilation"
    )
    p.add_argument(
        "--compile-seconds", type=float, default=60.0, help="training time allowed for compilation"
    )
    p.add_argument(
        "--train-kernel", default="auto", choices=TRAIN_KERNELS, help="the training's window + cache step"
    )
    p.add_argument("--data", default="gutenberg", help="the training figure's corpus (a conf/data name)")
    p.add_argument(
        "--train-overrides",
        default="",
        help="more Hydra overrides for the training, space-separated (e.g. module.compile_mode=default)",
    )
    p.add_argument(
        "--batch-sizes",
        default="auto",
        help="per-process batch sizes to try, first that fits; auto: the paper's 16 first on a device of at least "
        f"{LARGE_MEMORY_GB} GB, else 8 (16 ran out of an H100's 80 GB)",
    )
    p.add_argument(
        "--budgets", default=",".join(f"{BUDGETS[name]:.0f}" for name in SECTIONS), help="seconds per section"
    )
    p.add_argument("--kernels", default=",".join(KERNELS), help="the attention section's kernels, in order")
    p.add_argument("--skip", default="", help="sections to leave out: attention,training,tests")
    return p


Job = Callable[[Callable[[Any], None]], Any]


def attention_kernels(names: str) -> list[str]:
    """``--kernels``: known attention kernels, comma-separated (one line naming the allowed ones otherwise)."""
    chosen = [k for k in names.split(",") if k]
    unknown = [k for k in chosen if k not in KERNELS]
    if unknown or not chosen:
        raise SystemExit(
            f"bench-gpu: --kernels {names!r}: unknown {unknown or 'none given'}; allowed: {','.join(KERNELS)}"
        )
    return chosen


def batch_sizes(option: str, device_bytes: int) -> list[int]:
    """``--batch-sizes``: the per-process batches to try in order. ``auto``: the paper preset's 16 first where the
    device has at least :data:`LARGE_MEMORY_GB` GB (batch 8 peaked at 40 GB on an H200, 2026-11-28: 16 fits an H200's
    141 GB, not an H100's 80), then 8, 4, 2. A larger batch is also a smaller share of the host's fixed work per
    step."""
    if option == "auto":
        return [16, 8, 4, 2] if device_bytes >= LARGE_MEMORY_GB * 10**9 else [8, 4, 2]
    return [int(b) for b in option.split(",")]


def _batches(option: str) -> list[int]:
    return batch_sizes(option, torch.cuda.get_device_properties(0).total_memory)


def training_shape(args: argparse.Namespace) -> tuple[str, ...]:
    """The training section's overrides: the paper's shape with ``--train-kernel`` and ``--data``, then
    ``--train-overrides``."""
    extra = args.train_overrides.split()
    return (*TRAIN_SHAPE, f"model.attention.kernel={args.train_kernel}", f"data={args.data}", *extra)


def jobs(args: argparse.Namespace) -> list[tuple[str, Job]]:
    """The sections in order, each a function of ``save`` (which writes a partial result) with its budget."""
    budgets = dict(zip(SECTIONS, (float(b) for b in args.budgets.split(",")), strict=True))
    lengths, kernels = [int(n) for n in args.lengths.split(",")], attention_kernels(args.kernels)
    shape = training_shape(args)
    every: dict[str, Job] = {
        "attention": lambda save: attention_section(
            budgets["attention"], save, kernels=kernels, lengths=lengths, head_dim=args.head_dim
        ),
        "training": lambda save: training_section(
            shape, args.train_seconds, _batches(args.batch_sizes), budgets["training"], args.compile_seconds
        ),
        "tests": lambda save: tests_section(budgets["tests"]),
    }
    skip = set(filter(None, args.skip.split(",")))
    return [(name, every[name]) for name in SECTIONS if name not in skip]


def run_sections(path: Path, sections: dict[str, Any], jobs: Sequence[tuple[str, Job]]) -> bool:
    """Run each ``(name, job)`` in turn, the report rewritten (atomically) after each and whenever a job saves a
    partial result: a run cut short (a device call's time limit) keeps every section that finished. A job that
    raises records its ``error`` and the next runs. One line per section with its wall clock; returns whether
    every section succeeded (none has an ``error``)."""
    write_report(path, sections)
    ok = True
    for name, job in jobs:
        start = time.monotonic()

        def save(partial: Any, name: str = name) -> None:
            sections[name] = partial
            write_report(path, sections)

        try:
            sections[name] = job(save)
        except Exception as err:  # noqa: BLE001 - a failed section is recorded, the next one runs
            sections[name] = {"error": f"{type(err).__name__}: {err}"}
        sections[name]["seconds"] = round(time.monotonic() - start, 1)
        ok = ok and "error" not in sections[name]
        write_report(path, sections)
        print(f"bench-gpu: {name} {'done' if 'error' not in sections[name] else 'failed'} in "
              f"{time.monotonic() - start:.0f} s", flush=True)  # fmt: skip
    return ok


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if not torch.cuda.is_available():
        print("bench-gpu: skipped, no CUDA device here (torch.cuda.is_available() is False)")
        return 0
    path = Path(args.out)
    ok = run_sections(path, {"device": device_info()}, jobs(args))
    print(f"bench-gpu: {path}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
