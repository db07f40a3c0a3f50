"""The benchmark driver: every configuration in a fresh worker process, the records, the ``torch.mm`` reference."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from tvq_exp.attention import BACKENDS
from tvq_exp.files import atomic_write, write_text
from tvq_exp.tools.bench.cases import KERNEL_VARIANTS
from tvq_exp.tools.bench.report import plot, print_table, row

ATTENTION_SETTINGS = {"batch": 1, "heads": 1, "d_k": 128, "d_v": 256, "codebook_size": 512, "block_len": 512}
MODEL_SETTINGS = {
    "d_model": 256,
    "n_layers": 4,
    "codebook_size": 512,
    "block_len": 512,
    "batch": 1,
    "vocab_size": 256,
}
RECORD_FIELDS = ("ms", "tokens_per_s", "peak_mem_mb", "gflops", "gflops_per_s", "mm_fraction")


def measure(spec: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """Run :func:`run_worker` for ``spec`` in a fresh interpreter; failures become an ``error``."""
    cmd = [sys.executable, "-m", "tvq_exp.tools.bench", "_worker", json.dumps(spec)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"error": f"skipped: too slow (over the {timeout_s:.0f} s timeout)"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    if proc.returncode in (-9, 137):
        return {"error": "out of memory (worker killed by the kernel)"}
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return {"error": f"worker failed (exit {proc.returncode}): {tail[:200]}"}


def mm_gflops(args: argparse.Namespace) -> float:
    """``torch.mm`` GFLOP/s of this machine, measured in a worker."""
    spec = {"kind": "mm", "size": args.mm_size, "device": args.device, "dtype": args.dtype, "reps": 10}
    spec |= {"budget_s": 5.0, "threads": args.threads}
    result = measure(spec, args.timeout)
    return result["flops"] / (result["ms"] / 1e3) / 1e9 if "ms" in result else float("nan")


def write_records(path: str | None, records: list[dict[str, Any]]) -> None:
    """``records`` as JSON into ``path`` (nothing when ``None``), every field of :data:`RECORD_FIELDS` present
    (``None`` until known), replacing the file in one step so an interrupted run leaves the last whole one."""
    if path is None:
        return
    text = json.dumps([{f: None for f in RECORD_FIELDS} | rec for rec in records], indent=1)
    write_text(Path(path).name, Path(path).parent, text)


def run_sweep(
    args: argparse.Namespace, kind: str, names: Sequence[str], modes: Sequence[str]
) -> list[dict[str, Any]]:
    """Measure every (name, mode, length); returns the records (without the mm fractions). With ``--json`` the
    file is rewritten after each record, so what was measured survives a crash or a kill."""
    records = []
    for name in names:
        for mode in modes:
            last: tuple[int, float] | None = None
            for t in args.lengths:
                rec = {
                    "backend": name,
                    "seq_len": t,
                    "mode": mode,
                    **_measure_one(args, kind, name, mode, t, last),
                }
                if rec.get("ms") is not None:
                    last = (t, rec["ms"])
                records.append(rec)
                print(row(rec), flush=True)
                write_records(args.json, records)
    return records


def model_settings(args: argparse.Namespace, name: str) -> dict[str, Any]:
    """:data:`MODEL_SETTINGS` at ``--d-model`` / ``--n-layers``, with the ``--set`` overrides of model ``name``."""
    overrides = [item for model, item in args.set if model in ("*", name)]
    return MODEL_SETTINGS | {"d_model": args.d_model, "n_layers": args.n_layers, "overrides": overrides}


def _measure_one(
    args: argparse.Namespace,
    kind: str,
    name: str,
    mode: str,
    t: int,
    last: tuple[int, float] | None,
) -> dict[str, Any]:
    settings = ATTENTION_SETTINGS if kind == "attention" else model_settings(args, name)
    if kind == "attention" and name not in BACKENDS and name not in KERNEL_VARIANTS:
        known = ", ".join(sorted([*BACKENDS, *KERNEL_VARIANTS]))
        return {"error": f"unknown backend {name!r} (not implemented yet; known: {known})"}
    if last is not None:
        estimate = 2 * last[1] / 1e3 * (t / last[0]) ** 2  # warm-up + one call, quadratic in T
        if estimate > args.timeout:
            return {"error": f"skipped: too slow (estimated {estimate:.0f} s > {args.timeout:.0f} s timeout)"}
    spec = {
        "kind": kind, "backend": name, "seq_len": t, "mode": mode, "device": args.device, "dtype": args.dtype,
        "settings": settings, "window_bias": args.window_bias, "reps": args.reps, "budget_s": args.budget,
        "threads": args.threads, "mem_limit_mb": args.mem_limit_mb,
    }  # fmt: skip
    load = os.getloadavg()[0]
    result = measure(spec, args.timeout)
    tokens = settings["batch"] * t
    out: dict[str, Any] = {
        "device": args.device,
        "dtype": args.dtype,
        "threads": args.threads or torch.get_num_threads(),
    }
    out["load_avg_1min"] = round(load, 2)
    if kind == "model":
        out |= {
            "d_model": settings["d_model"],
            "n_layers": settings["n_layers"],
            "overrides": settings["overrides"],
        }
    if "ms" in result:
        flops = result.pop("flops", None)
        out.update(result, tokens_per_s=tokens / (result["ms"] / 1e3))
        if flops is not None:
            out.update(gflops=flops / 1e9, gflops_per_s=flops / 1e9 / (result["ms"] / 1e3))
    else:
        out.update(result)
    return out


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Run the ``attention`` or ``model`` benchmark; write JSON (after each record) / plot, their folders
    created (:mod:`tvq_exp.files`); return the records."""
    kind = args.command
    names = args.backends if kind == "attention" else args.models
    mm_before = mm_gflops(args)
    print(f"torch.mm {args.mm_size}^2 {args.dtype}: {mm_before:.1f} GFLOP/s", flush=True)
    records = run_sweep(args, kind, names, args.mode)
    mm_after = mm_gflops(args)
    mm_ref = max(mm_before, mm_after)
    print(
        f"torch.mm {args.mm_size}^2 {args.dtype} after the run: {mm_after:.1f} GFLOP/s; reference {mm_ref:.1f}"
    )
    for rec in records:
        rec["mm_gflops_per_s"] = mm_ref
        if rec.get("gflops_per_s") is not None:
            rec["mm_fraction"] = rec["gflops_per_s"] / mm_ref
    for rec in records:
        for field in RECORD_FIELDS:
            rec.setdefault(field, None)
    print_table(records)
    write_records(args.json, records)
    if args.plot:
        with atomic_write(args.plot, Path(args.plot).parent) as png:
            plot(records, png, kind)
    return records
