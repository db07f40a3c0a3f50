"""``make bench-gpu`` (``python -m tvq_exp.tools.bench.gpu --out bench/gpu.json``): the GPU check on one
CUDA device, written to one JSON file.

1. ``attention``: dense attention through flex-attention against VQ (plain and flex kernels), bf16, the XL
   window bias on, forward and training step, at T = 16k and 64k (``--lengths``: the paper's go to 131k), via
   ``python -m tvq_exp.bench attention``;
2. ``training``: ``experiment=enwik8_paper``'s model and TBPTT shape (48 GAUs, d_model 768, 2048-token updates
   of 8192-token sequences) on one GPU for ``--train-seconds`` (90 s) on ``--data`` (the Gutenberg books;
   enwik8 is not on the lent machines; the shape, not the corpus, sets the cost): tokens/s and peak memory from the
   throughput callback (the per-process batch halves from 16 until it fits);
3. ``tests``: every test whose id names ``cuda`` (``pytest -k cuda``), with its pass/fail counts (a test module
   that cannot be imported there, for want of a dev extra, counts as an error and the rest still run).

The JSON file is rewritten after each section, so a run cut short keeps what finished. Time: the attention
section's 12 configurations take up to ``--timeout`` (25 s) each, the training figure ``--train-seconds`` plus
its start (about 40 s), the tests about 90 s: allow 9 minutes. Without a CUDA device it prints one line and
exits 0, writing nothing.
"""

from __future__ import annotations

import argparse
import csv
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from tvq_exp.files import write_text
from tvq_exp.tools.train_command import run_train

REPO = Path(__file__).resolve().parents[3]
LENGTHS = (16384, 65536)  # with the defaults below the whole check fits one 10-minute device call
BACKENDS = ("dense_flex", "vq", "vq_flex")
TRAIN_SHAPE = (
    "experiment=enwik8_paper", "trainer=gpu", "trainer.devices=1", "global_batch_size=null",
    "trainer.check_val_every_n_epoch=null", "trainer.val_check_interval=1000000", "trainer.limit_val_batches=1",
    "trainer.max_steps=1000000", "trainer.log_every_n_steps=10", "logger=csv",
    "trainer.enable_progress_bar=false",
)  # fmt: skip


def device_info() -> dict[str, Any]:
    """The machine the figures come from."""
    props = torch.cuda.get_device_properties(0)
    return {
        "name": props.name,
        "memory_gb": round(props.total_memory / 2**30, 1),
        "capability": f"{props.major}.{props.minor}",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


def attention_section(
    device: str,
    dtype: str,
    lengths: Sequence[int],
    backends: Sequence[str],
    timeout_s: float,
    mm_size: int = 2048,
) -> dict[str, Any]:
    """``python -m tvq_exp.bench attention`` with the window bias: its records (one per backend, length and
    mode; ``error`` where a configuration did not fit or took too long)."""
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "attention.json"
        command = [
            sys.executable, "-m", "tvq_exp.bench", "attention", "--device", device, "--dtype", dtype,
            "--backends", ",".join(backends), "--lengths", ",".join(map(str, lengths)), "--mode", "fwd,fwdbwd",
            "--window-bias", "--reps", "3", "--budget", "10", "--timeout", str(timeout_s), "--mm-size", str(mm_size),
            "--json", str(out),
        ]  # fmt: skip
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
        if done.returncode != 0 or not out.is_file():
            return {"command": " ".join(command[1:]), "error": done.stderr.strip().splitlines()[-1:]}
        return {"command": " ".join(command[1:]), "records": json.loads(out.read_text())}


def throughput(metrics_csv: Path, warmup: float = 0.2) -> dict[str, Any]:
    """Tokens/s (the median over the rows after the first ``warmup`` share) and peak memory (the largest) that
    the throughput callback logged to a CSV logger's ``metrics.csv``."""
    rows = [r for r in csv.DictReader(metrics_csv.open()) if r.get("throughput/tokens_per_s")]
    if not rows:
        raise ValueError(f"{metrics_csv}: no throughput/tokens_per_s rows")
    steady = rows[int(len(rows) * warmup) :] or rows
    return {
        "tokens_per_s": statistics.median(float(r["throughput/tokens_per_s"]) for r in steady),
        "peak_mem_mb": max(float(r["throughput/peak_mem_mb"]) for r in rows),
        "last_step": int(float(rows[-1]["step"])),
        "rows": len(rows),
    }


def training_section(shape: Sequence[str], seconds: float, batch_sizes: Sequence[int]) -> dict[str, Any]:
    """Train ``shape`` for ``seconds`` at the first batch size in ``batch_sizes`` that fits; its throughput."""
    tried = []
    for batch in batch_sizes:
        with tempfile.TemporaryDirectory() as scratch:
            limit = time.strftime("%H:%M:%S", time.gmtime(seconds))
            args = [*shape, f"data.batch_size={batch}", f"++trainer.max_time=00:{limit}", f"paths.log_dir={scratch}",
                    "run_name=bench_gpu"]  # fmt: skip
            done = run_train(args)
            metrics = Path(scratch) / "runs" / "bench_gpu" / "csv" / "metrics.csv"
            if done.returncode == 0 and metrics.is_file():
                return {"command": "python train.py " + " ".join(args[:-2]), "batch_size": batch,
                        "tried": tried, **throughput(metrics)}  # fmt: skip
            tried.append({"batch_size": batch, "error": (done.stderr.strip().splitlines() or ["?"])[-1]})
    return {"command": "python train.py " + " ".join(shape), "tried": tried, "error": "no batch size fitted"}


def tests_section(selection: str = "cuda") -> dict[str, Any]:
    """``pytest -k SELECTION`` over the test suite: the counts from its JUnit report, and its last line."""
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "junit.xml"
        command = [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "-k", selection,
                   "--continue-on-collection-errors", f"--junitxml={report}", "tests"]  # fmt: skip
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
        counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
        if report.is_file():
            for suite in ElementTree.parse(report).getroot().iter("testsuite"):
                for key in counts:
                    counts[key] += int(suite.get(key, 0))
        lines = done.stdout.strip().splitlines()
        return {"command": "pytest -k " + selection, "returncode": done.returncode, **counts,
                "summary": lines[-1] if lines else ""}  # fmt: skip


def write_report(path: Path, sections: dict[str, Any]) -> Path:
    """The sections as one JSON file (atomically)."""
    return write_text(path.name, path.parent, json.dumps(sections, indent=1) + "\n")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tvq_exp.tools.bench.gpu", description=__doc__.split("\n")[0])
    p.add_argument("--out", default="bench/gpu.json", help="the JSON file to write")
    p.add_argument("--lengths", default=",".join(map(str, LENGTHS)), help="attention lengths T")
    p.add_argument("--train-seconds", type=float, default=90.0, help="wall clock of the training figure")
    p.add_argument("--data", default="gutenberg", help="the training figure's corpus (a conf/data name)")
    p.add_argument(
        "--batch-sizes", default="16,8,4,2", help="per-process batch sizes to try, first that fits"
    )
    p.add_argument(
        "--timeout", type=float, default=25.0, help="seconds per attention configuration (12 of them at most)"
    )
    p.add_argument("--skip", default="", help="sections to leave out: attention,training,tests")
    return p


def run_sections(path: Path, sections: dict[str, Any], jobs: Sequence[tuple[str, Callable[[], Any]]]) -> Path:
    """Run each ``(name, job)`` in turn, the report rewritten (atomically) after each: a run cut short (a device
    call's time limit) keeps every section that finished. One line per section with its wall clock."""
    write_report(path, sections)
    for name, job in jobs:
        start = time.monotonic()
        sections[name] = job()
        write_report(path, sections)
        print(f"bench-gpu: {name} done in {time.monotonic() - start:.0f} s", flush=True)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if not torch.cuda.is_available():
        print("bench-gpu: skipped, no CUDA device here (torch.cuda.is_available() is False)")
        return 0
    skip = set(filter(None, args.skip.split(",")))
    lengths = [int(n) for n in args.lengths.split(",")]
    shape = (*TRAIN_SHAPE, f"data={args.data}")
    batches = [int(b) for b in args.batch_sizes.split(",")]
    jobs = [
        ("attention", lambda: attention_section("cuda", "bf16", lengths, BACKENDS, args.timeout)),
        ("training", lambda: training_section(shape, args.train_seconds, batches)),
        ("tests", tests_section),
    ]
    path = run_sections(
        Path(args.out), {"device": device_info()}, [job for job in jobs if job[0] not in skip]
    )
    print(f"bench-gpu: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
