"""Block-size tuning of the fused window + cache kernels on one CUDA device:
``python -m tvq_exp.attention.vq.fused.tune --out tune.json``.

Over 300 lines: one search (its case, candidates, records, choice and table) over the fused op's kernels and the
cache means' block sums, which share its timing, its checks and its report.

The case is the GPU check's ``vq_triton`` attention (:mod:`tvq_exp.tools.bench.gpu_attention`: bf16, ``S = L``
= 512 (``--block``), ``B·H·T`` = 512k tokens, head dim ``--head-dim``) at ``--seq-len``. For each kernel of
:data:`TUNED` in turn (the cache means' block sums, then
:data:`~tvq_exp.attention.vq.fused.config.KERNEL_NAMES`), each candidate :class:`~.config.Tiles` of
:data:`SUMS_CANDIDATES` or :data:`CANDIDATES` replaces the shipped tiles of that kernel alone (the others keep
theirs): the block sums and the forward kernel are timed forward, the three backward kernels forward + backward.
Every candidate's output and gradients are compared with the shipped configuration's (relative error; a tiling only
reorders fp32 sums, so a large error is a defect, not rounding). First a profile of the shipped configuration (time
per device kernel) at ``--seq-len``; then the tile search, in ``--search-share`` of ``--budget``; then the best
tiles of each kernel together against the shipped ones at ``--lengths``.

One ``TUNE {json}`` line per record as it is done, the JSON file rewritten after each, a table at the end. On a CPU
(``--device cpu``, under ``TRITON_INTERPRET=1``) it runs the same steps on small sizes: a check of this tool, not
a measurement.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from time import monotonic
from typing import Any

import torch
from torch import Tensor

from tvq_exp.attention.vq.fused import config, op, prefix
from tvq_exp.attention.vq.fused.config import KERNEL_NAMES, Tiles
from tvq_exp.measure.profile import profile_calls
from tvq_exp.measure.timing import time_calls

HEADS = 4
# per kernel, (bm, bn, num_warps, num_stages), timed after the shipped tiles (and their twin by pointers); bdv stays
# the shipped one. First, so that the budget reaches them: the forward's and dq's third stage through descriptors
# (229,440 B of shared memory, within 227 KB; dq's 129 KB: one program a multiprocessor), the keys' and codes'
# gradients at the rows shipped until the nineteenth session (16 and 32). Then older tiles: 64 rows on 8 warps, the
# backward's before the Triton 3.6 tiles (1 and 2 stages), the forward's 64-key step (until the seventeenth)
CANDIDATES: dict[str, tuple[tuple[int, int, int, int], ...]] = {
    "forward": ((128, 128, 8, 3), (64, 64, 8, 2), (64, 64, 4, 2), (64, 32, 4, 2), (128, 64, 8, 3), (128, 32, 8, 2),
                (128, 64, 8, 2), (128, 128, 8, 2)),
    "dq": ((64, 64, 4, 3), (64, 32, 8, 1), (64, 64, 8, 1), (64, 32, 4, 1), (64, 32, 4, 2), (64, 64, 4, 1),
           (64, 64, 4, 2), (128, 32, 8, 1), (128, 32, 8, 2), (128, 64, 8, 1)),
    "window_key": ((16, 128, 8, 2), (32, 64, 8, 1), (64, 64, 8, 1), (32, 128, 8, 1), (32, 64, 4, 1), (64, 128, 8, 1)),
    "code": ((32, 128, 8, 2), (64, 64, 8, 1), (32, 128, 8, 1), (32, 64, 4, 1), (64, 128, 8, 1), (128, 128, 8, 1)),
}  # fmt: skip
# the cache means' block sums (:mod:`.prefix`, ``block_sums_kernel``: 0.89 ms of VQ's 9.9 at 32k, the largest
# means kernel on an H200, 2026-11-29, when each program multiplied every position of its block; each reads only its
# codes' run of the sorted codes since, untimed), as (codes, positions a step, columns, warps, stages): the whole
# head's columns, more positions a step, deeper pipelines, more or fewer codes a program
SUMS = "block_sums"
SUMS_CANDIDATES: tuple[tuple[int, int, int, int, int], ...] = (
    (128, 32, 64, 8, 2), (128, 32, 128, 8, 2), (64, 32, 128, 4, 2), (64, 32, 64, 4, 3), (64, 64, 128, 4, 2),
    (32, 32, 64, 4, 2), (32, 16, 128, 4, 2),
)  # fmt: skip
TUNED = (SUMS, *KERNEL_NAMES)  # the kernels whose tiles are searched, in this order
FORWARD_ONLY = ("forward", SUMS)  # timed forward; the others forward + backward
TOLERANCE = 1e-2  # bf16 results: a different tiling's rounding stays far under this


@contextmanager
def using(chosen: dict[str, Tiles]) -> Iterator[None]:
    """The fused op (and the cache means' block sums, :data:`SUMS`) take ``chosen[kernel]`` for the kernels named
    there, the shipped tiles elsewhere."""
    shipped, shipped_means = op.tiles, prefix.kernel_tiles

    def pick(kernel: str, *args: Any, **kwargs: Any) -> Tiles:  # config.tiles' arguments
        return chosen.get(kernel) or shipped(kernel, *args, **kwargs)

    def pick_means(interpret: bool, kernel: str) -> tuple[int, ...]:
        t = chosen.get(SUMS) if kernel == "sums" else None
        return (t.bm, t.bn, t.bdv, t.num_warps, t.num_stages) if t else shipped_means(interpret, kernel)

    op.tiles, prefix.kernel_tiles = pick, pick_means
    try:
        yield
    finally:
        op.tiles, prefix.kernel_tiles = shipped, shipped_means


def candidates(kernel: str, d_k: int, d_v: int, block: int) -> list[Tiles]:
    """The shipped tiles of ``kernel`` for blocks of ``block`` keys and as many codes first (then, where they load
    through tensor descriptors, the same tiles by pointers), then the other shapes of :data:`CANDIDATES` (through
    descriptors where :func:`~.config.loads_by_descriptor` takes their keys). The block sums' (:data:`SUMS`): the
    GPU's shipped tiles, then :data:`SUMS_CANDIDATES` (``bm`` codes, ``bn`` positions a step, ``bdv`` columns)."""
    if kernel == SUMS:
        shipped = Tiles(*prefix.GPU_TILES["sums"])
        return list(dict.fromkeys([shipped, *(Tiles(*c) for c in SUMS_CANDIDATES)]))
    base = config.tiles(kernel, d_k, d_v, block=block, codes=block)
    out = list(dict.fromkeys([base, dataclasses.replace(base, tma=False)]))
    for bm, bn, warps, stages in CANDIDATES[kernel]:
        t = Tiles(bm, bn, base.bdv, warps, stages, base.tma and config.loads_by_descriptor(kernel, bn, d_k))
        if t not in out:
            out.append(t)
    return out


class Case:
    """The GPU check's ``vq_triton`` layer and bf16 inputs at one length: ``(B, H, T, d)`` views of ``(B, T, H,
    d)`` leaves, as a model's projections give them."""

    def __init__(
        self, seq_len: int, head_dim: int, tokens: int, device: torch.device, block: int = 512
    ) -> None:
        from tvq_exp.attention import build_attention

        self.device = device
        # bf16 on the GPU; fp32 under the interpreter (its bf16 dots and casts are not Triton's)
        self.dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        batch = max(1, tokens // (seq_len * HEADS))
        self.block = block = min(block, seq_len)  # keys per block and codes
        gen = torch.Generator(device="cpu").manual_seed(0)
        shape = (batch, seq_len, HEADS, head_dim)
        self.leaves = [
            (torch.randn(shape, generator=gen) * head_dim**-0.25).to(device, self.dtype).requires_grad_()
            for _ in range(3)
        ]
        self.grad = torch.randn(shape, generator=gen).to(device, self.dtype).transpose(1, 2)
        self.layer = build_attention("vq", d_k=head_dim, d_v=head_dim, heads=HEADS, codebook_size=block,
                                     block_len=block, kernel="triton").to(device)  # fmt: skip
        self.flops = {train: self.layer.flops(seq_len, batch, backward=train) for train in (False, True)}

    def call(self, train: bool) -> Callable[[], Tensor]:
        q, k, v = (x.transpose(1, 2) for x in self.leaves)

        def run() -> Tensor:
            with (
                torch.set_grad_enabled(train),
                torch.autocast(self.device.type, torch.bfloat16, enabled=self.dtype == torch.bfloat16),
            ):
                out = self.layer(q, k, v)[0]
            if train:
                out.backward(self.grad)
            return out

        return run

    def results(self) -> list[Tensor]:
        """The output and the three inputs' gradients (fp32 copies: later backward calls accumulate into ``.grad``)."""
        for x in self.leaves:
            x.grad = None
        out = self.call(True)()
        return [out.detach().float().clone(), *(x.grad.float().clone() for x in self.leaves)]


def relative_error(got: Sequence[Tensor], want: Sequence[Tensor]) -> float:
    """The largest ``‖got − want‖ / ‖want‖`` over the tensors (``inf`` for a NaN)."""
    worst = 0.0
    for g, w in zip(got, want, strict=True):
        err = float((g - w).norm() / w.norm().clamp_min(1e-30))
        worst = max(worst, err if err == err else float("inf"))
    return worst


def timed(case: Case, train: bool, reps: int) -> dict[str, float]:
    """Median ms of ``reps`` synchronised calls after a warm-up (which compiles), and TFLOP/s of useful work."""
    times = time_calls(case.call(train), case.device, reps, budget_s=3.0)
    ms = sorted(times)[len(times) // 2]
    return {"ms": ms, "tflops_per_s": case.flops[train] / (ms / 1e3) / 1e12}


def tile_record(kernel: str, t: Tiles, case: Case, want: list[Tensor], reps: int) -> dict[str, Any]:
    """One candidate of one kernel: its time and its error against the shipped configuration."""
    train = kernel not in FORWARD_ONLY
    record: dict[str, Any] = {"kernel": kernel, **dataclasses.asdict(t),
                              "mode": "fwdbwd" if train else "fwd"}  # fmt: skip
    try:
        with using({kernel: t}):
            record |= timed(case, train, reps)
            record["rel_err"] = relative_error(case.results(), want)
            record["kernel_ms"] = kernel_ms(profile(case, train), kernel)
    except Exception as err:  # noqa: BLE001 - a candidate that does not compile or fit is recorded, the next runs
        record["error"] = f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[0][:160]}"
    finally:
        if case.device.type == "cuda":
            torch.cuda.empty_cache()
    return record


def best_tiles(records: Sequence[dict[str, Any]]) -> dict[str, Tiles]:
    """Per kernel, the candidate within :data:`TOLERANCE` of the shipped results (and without an error) whose kernel
    took the least device time (the layer's wall time where the profile has no such kernel: on a CPU). The kernel's
    own time, since the layer's wall time also holds the work around the kernels, whose spread hides the tiles'
    differences."""
    best: dict[str, tuple[float, Tiles]] = {}
    for r in records:
        checked = "error" not in r and r.get("rel_err", TOLERANCE + 1) <= TOLERANCE  # not failed after timing
        if r.get("section") != "tiles" or "ms" not in r or not checked:
            continue
        t = Tiles(r["bm"], r["bn"], r["bdv"], r["num_warps"], r["num_stages"], r.get("tma", False))
        cost = r["ms"] if r.get("kernel_ms") is None else r["kernel_ms"]
        if r["kernel"] not in best or cost < best[r["kernel"]][0]:
            best[r["kernel"]] = (cost, t)
    return {kernel: t for kernel, (_, t) in best.items()}


def profile(case: Case, train: bool) -> dict[str, Any]:
    """Time per device kernel of one call (the current tiles), largest first (CPU ops' own time on a CPU): every
    kernel, each counted once, so that their sum against the call's wall time says how busy the device was."""
    run = case.call(train)
    run()
    return profile_calls(run, case.device, rows=1000)


def kernel_ms(summary: dict[str, Any], kernel: str) -> float | None:
    """The device time of ``kernel`` (its Triton function ``{kernel}_kernel``) in a profile."""
    return next((r["ms_per_step"] for r in summary["rows"] if r["name"] == f"{kernel}_kernel"), None)


def tune(args: argparse.Namespace, save: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Every section in turn; ``save`` gets the report after each record."""
    device, start = torch.device(args.device), monotonic()
    report: dict[str, Any] = {"args": vars(args), "records": []}

    def add(record: dict[str, Any]) -> None:
        print("TUNE " + json.dumps(record), flush=True)
        report["records"].append(record)
        save(report)

    case = Case(args.seq_len, args.head_dim, args.tokens, device, args.block)
    want = case.results()
    report["profile"] = {mode: profile(case, mode == "fwdbwd") for mode in ("fwd", "fwdbwd")}
    report["device_ms"] = {mode: summary["ms_per_step"] for mode, summary in report["profile"].items()}
    save(report)
    kernels = [k for k in TUNED if k in args.kernels.split(",")]
    for kernel in kernels:  # the search takes its share of the budget, the comparison of lengths the rest
        for t in candidates(kernel, args.head_dim, args.head_dim, case.block):
            if monotonic() - start > args.budget * args.search_share:
                add({"section": "tiles", "kernel": kernel, "error": "skipped: budget"})
                break
            add(
                {"section": "tiles", "seq_len": args.seq_len, **tile_record(kernel, t, case, want, args.reps)}
            )
    chosen = best_tiles(report["records"])
    report["best"] = {k: vars(t) for k, t in chosen.items()}
    del case
    for seq_len in (int(n) for n in args.lengths.split(",")):
        case = Case(seq_len, args.head_dim, args.tokens, device, args.block)
        for train in (False, True):
            for name, tiles in (("shipped", {}), ("tuned", chosen)):
                record = {
                    "section": "lengths",
                    "tiles": name,
                    "seq_len": seq_len,
                    "mode": "fwdbwd" if train else "fwd",
                }
                if monotonic() - start > args.budget:
                    add(record | {"error": "skipped: budget"})
                    continue
                with using(tiles):
                    add(record | timed(case, train, args.reps))
        del case
    return report


def table(report: dict[str, Any]) -> str:
    """The records as a markdown table, then the best tiles and the profile's largest kernels."""
    lines = [
        "| section | kernel / tiles | T | mode | bm×bn×bdv w s | ms | TFLOP/s | rel err | kernel ms |",
        "|---|---|--:|---|---|--:|--:|--:|--:|",
    ]
    for r in report["records"]:
        loads = " tma" if r.get("tma") else ""  # through tensor descriptors
        shape = (
            f"{r['bm']}×{r['bn']}×{r['bdv']} {r['num_warps']} {r['num_stages']}{loads}" if "bm" in r else ""
        )
        cells = (f"{r['ms']:.3f}", f"{r['tflops_per_s']:.1f}") if "ms" in r else (r.get("error", "?"), "")
        err = f"{r['rel_err']:.1e}" if "rel_err" in r else ""
        own = f"{r['kernel_ms']:.3f}" if r.get("kernel_ms") is not None else ""
        lines.append(f"| {r['section']} | {r.get('kernel', r.get('tiles', ''))} | {r.get('seq_len', '')} | "
                     f"{r.get('mode', '')} | {shape} | {cells[0]} | {cells[1]} | {err} | {own} |")  # fmt: skip
    lines.append(f"best: {report.get('best')}")
    for mode, summary in report.get("profile", {}).items():
        top = "; ".join(
            f"{r['name']} {r['ms_per_step']:.3f} ms ×{r['calls_per_step']:g}" for r in summary["rows"][:12]
        )
        lines.append(
            f"profile {mode} (device busy {summary['ms_per_step']:.2f} of {summary['wall_ms_per_step']:.2f} ms): {top}"
        )
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m tvq_exp.attention.vq.fused.tune", description=__doc__.split("\n")[0]
    )
    p.add_argument("--out", default="bench/tune.json", help="the JSON file to write")
    p.add_argument("--seq-len", type=int, default=32768, help="T of the tile search")
    p.add_argument("--lengths", default="8192,32768,131072", help="T of the tuned-against-shipped comparison")
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--block", type=int, default=512, help="keys per block and codes (S = L, the check's 512)")
    p.add_argument("--tokens", type=int, default=512 * 1024, help="B·H·T of every case")
    p.add_argument("--kernels", default=",".join(TUNED), help="the kernels whose tiles are searched")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--budget", type=float, default=150.0, help="seconds after which the rest is skipped")
    p.add_argument("--search-share", type=float, default=0.6, help="the search's share of it")
    p.add_argument("--device", default="cuda")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("tune: skipped, no CUDA device here (torch.cuda.is_available() is False)")
        return 0
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)

    def save(report: dict[str, Any]) -> None:
        path.write_text(json.dumps(report, indent=1) + "\n")

    print(table(tune(args, save)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
