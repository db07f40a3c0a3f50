"""The nearest-code search (``tvq_exp/quantize/nearest_kernel.py``) compiled for sm_90a by whichever Triton and tree
are first on the path: fp32 keys in three tf32 passes (the kernel the H100 of 2026-11-27 ran, 1.34 ms at 512k keys),
and bf16 keys against the codes' three bf16 pieces at the shipped tiles and other candidates. d_k = 128, S = 512.

Per configuration: registers, spills, shared memory; the SASS instructions per thread of the loop over code tiles,
of them ``HGMMA`` (the products) and ``LDSM`` (``ldmatrix``); the issue cycles (four schedulers a multiprocessor) per
key and code; the tensor-core cycles per key and code (``3·d_k`` multiply-adds, 2048 a cycle in bf16 at an H100
SXM's datasheet rate, 1024 in tf32); the products' shared-memory bytes per tensor-core cycle (``key_tiles.py``'s
model); the codebook bytes each key's program reads from L2 (``S`` codes in every piece, shared by its ``BM`` keys);
and, at 512k keys, the time the tensor cores alone would take at 1.83 GHz on 132 multiprocessors. A model, not a
timing.

Run from the repository root, once with the venv's Triton and once with the lent GPUs' (3.6.0, as ``make
kernel-report-device`` installs it):

    .venv/bin/python docs/kernel_analysis/2026-11-29/nearest_pieces.py > docs/kernel_analysis/2026-11-29/nearest_pieces_3.8.log
    PYTHONPATH=.triton/3.6.0 .venv/bin/python docs/kernel_analysis/2026-11-29/nearest_pieces.py \\
        > docs/kernel_analysis/2026-11-29/nearest_pieces_3.6.log

The ``_before`` logs are the same script on the session's base (c1129e6, fp32 keys only), its tree first on the
path: ``git worktree add /tmp/base c1129e6``, then from ``/tmp/base`` the same commands with ``PYTHONPATH=/tmp/base``
(and ``.triton/3.6.0`` of this checkout before it for 3.6), the script and the logs named from this checkout.
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import key_tiles  # noqa: E402 - this folder's script: its compile hook and shared-memory model
import triton  # noqa: E402

from tvq_exp.attention.vq.fused import report  # noqa: E402
from tvq_exp.attention.vq.fused.config import Tiles  # noqa: E402

D_K, CODES, KEYS = 128, 512, 512 * 1024
MULTIPROCESSORS, CLOCK = 132, 1.83e9
# bf16 candidates besides the shipped tiles: (rows, codes a tile, warps, stages)
CANDIDATES = ((64, 64, 4, 2), (128, 64, 8, 3), (128, 128, 8, 2), (256, 64, 16, 2))
BF16 = "dtype" in inspect.signature(report.compile_nearest).parameters  # a tree with the bf16 keys' search


def line(dtype: str, t: Tiles | None, shipped: bool) -> str:
    # the base tree's search takes fp32 keys only, at its shipped tiles
    row = report.compile_nearest(D_K, dtype, t) if BF16 else report.compile_nearest(D_K)
    compiled = key_tiles._captured["compiled"]
    t = row.tiles
    ((size, hgmma, ldsm),) = key_tiles.loop_ops(compiled.asm["cubin"], "HGMMA", "LDSM")  # one loop
    pairs = t.bm * t.bn
    issue = size * t.num_warps / 4 / pairs
    tensor = 3 * D_K / (2048 if dtype == "bf16" else 1024)
    piece_bytes = 2 if dtype == "bf16" else 4
    codebook = 3 * CODES * D_K * 2 if dtype == "bf16" else CODES * D_K * piece_bytes  # read by each program
    tensor_ms = KEYS * CODES * tensor / MULTIPROCESSORS / CLOCK * 1e3
    rates = "; ".join(key_tiles.shared_rates(compiled.asm["ttgir"]))
    return (
        f"{dtype} keys {t.bm}x{t.bn} w{t.num_warps} s{t.num_stages}{' (shipped)' if shipped else ''}: regs "
        f"{row.registers} spills {row.spill_bytes} B smem {row.shared_bytes} B; loop {size} instructions "
        f"(HGMMA {hgmma}, LDSM {ldsm}); per key and code: issue {issue:.3f} cycles, tensor {tensor:.4f} "
        f"(issue / tensor {issue / tensor:.2f}); {rates}; codebook read per key {codebook / t.bm:.0f} B, at 512k "
        f"keys {KEYS / t.bm * codebook / 2**30:.2f} GiB; tensor cores alone at 512k keys {tensor_ms:.2f} ms"
    )


def main() -> None:
    report._row = key_tiles._grab
    here = os.path.dirname(report.__file__)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True, text=True)
    kernel_dir = os.path.join(here, "..", "..", "..", "quantize")
    changes = subprocess.run(
        ["git", "status", "--porcelain", "--", "."], cwd=kernel_dir, capture_output=True, text=True
    )
    tree = commit.stdout.strip() + ("+changes" if changes.stdout.strip() else "")
    print(f"Triton {triton.__version__}, sm_90a, d_k = {D_K}, S = {CODES}; the search of tree {tree}")
    print(line("fp32", None, True), flush=True)
    if not BF16:
        return
    print(line("bf16", None, True), flush=True)
    for bm, bs, warps, stages in CANDIDATES:
        print(line("bf16", Tiles(bm, bs, 0, num_warps=warps, num_stages=stages), False), flush=True)


if __name__ == "__main__":
    main()
