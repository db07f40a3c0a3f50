"""The nearest-code search's tiles timed on one CUDA device: ``python -m tvq_exp.quantize.tune_nearest --out
nearest.json``.

The case is the GPU check's attention: ``--keys`` keys per call (B·H·T = 512k, four heads), ``--codes`` codes of
``--dim`` (512, 128). Each record times one search, median ms of ``--reps`` calls after a warm-up (which compiles):
the plain search (:func:`~tvq_exp.quantize.kmeans.plain_nearest_code`, fp32 GEMMs), the fused search of the keys in
fp32 (three tf32 passes: how bf16 keys were searched until the twentieth session), and the fused search of the bf16
keys at the shipped tiles, then at each of :data:`CANDIDATES`; each with the share of keys whose code is not the
plain search's. One ``NEAREST {json}`` line per record, the JSON file rewritten after each. On a CPU (``--device
cpu``) the same records on small sizes under Triton's interpreter: a check of this tool, not a measurement.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from tvq_exp.measure.timing import time_calls
from tvq_exp.quantize import fused_nearest
from tvq_exp.quantize.kmeans import plain_nearest_code

# bf16 keys' (rows, codes a tile, warps, stages) besides the shipped ones
# (docs/kernel_analysis/2026-11-29/nearest_pieces.py compiles them)
CANDIDATES = ((128, 128, 8, 2), (128, 64, 8, 3), (256, 64, 16, 2), (64, 64, 4, 2))


@contextmanager
def bf16_tiles(tiles: tuple[int, int, int, int]) -> Iterator[None]:
    """The fused search takes ``tiles`` for bf16 keys."""
    shipped = fused_nearest.TILES[torch.bfloat16]
    fused_nearest.TILES[torch.bfloat16] = tiles
    try:
        yield
    finally:
        fused_nearest.TILES[torch.bfloat16] = shipped


def record(
    name: str, search: Callable[[], Tensor], want: Tensor, device: torch.device, reps: int
) -> dict[str, Any]:
    """One search's median time and the share of keys it gives another code than ``want``."""
    times = sorted(time_calls(search, device, reps, budget_s=5.0))
    return {"search": name, "ms": times[len(times) // 2], "differ": float((search() != want).float().mean())}


def records(args: argparse.Namespace) -> Iterator[dict[str, Any]]:
    """The plain search, the fused one of fp32 keys, then of bf16 keys at the shipped tiles and the candidates."""
    device = torch.device(args.device)
    gen = torch.Generator(device=device).manual_seed(0)
    shape = (args.heads, args.keys // args.heads, args.dim)
    x = torch.randn(shape, generator=gen, device=device).bfloat16()
    codebook = torch.randn(args.heads, args.codes, args.dim, generator=gen, device=device)
    want = plain_nearest_code(x, codebook)
    yield record("plain", lambda: plain_nearest_code(x, codebook), want, device, args.reps)
    wide = x.float()
    yield record(
        "fused, fp32 keys", lambda: fused_nearest.fused_nearest_code(wide, codebook), want, device, args.reps
    )
    shipped = fused_nearest.TILES[torch.bfloat16]
    for tiles in (shipped, *CANDIDATES):
        with bf16_tiles(tiles):
            name = f"fused, bf16 keys, {'x'.join(map(str, tiles))}{' (shipped)' if tiles == shipped else ''}"
            yield record(name, lambda: fused_nearest.fused_nearest_code(x, codebook), want, device, args.reps)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m tvq_exp.quantize.tune_nearest", description=__doc__.splitlines()[0]
    )
    p.add_argument("--out", default="bench/nearest.json", help="the JSON file to write")
    p.add_argument("--keys", type=int, default=512 * 1024, help="keys per call, over all heads")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--codes", type=int, default=512)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--device", default="cuda")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("tune_nearest: skipped, no CUDA device here (torch.cuda.is_available() is False)")
        return 0
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    done: list[dict[str, Any]] = []
    for rec in records(args):
        done.append(rec)
        print("NEAREST " + json.dumps(rec), flush=True)
        path.write_text(json.dumps({"args": vars(args), "records": done}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
