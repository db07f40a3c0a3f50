"""The keys' and codes' gradients (``window_key_kernel``, ``code_kernel``) at 16, 32 and 64 query rows a step, 1 and 2
pipeline stages, compiled for sm_90a by whichever Triton and tree are first on the path: registers, spills, shared
memory, SASS instructions per thread and row in each loop body (``key_tiles.py``'s count), and which of each product's
operands the tensor cores read from shared memory, with the bytes all the products read per tensor-core cycle
(``key_tiles.py``'s model: ``128x128(smem)·128x16``: the program's keys from shared memory, ``(regs)`` from
registers). ``*`` marks the shipped tiles. For the keys' gradient in one pass without the bias, the instructions per
thread over one key tile's rows in the check's case (:data:`MASKED_ROWS`, :data:`WHOLE_ROWS`), and their issue cycles
per tensor-core cycle (:func:`key_tile_work`).

Heads d 128 with values 128 (one pass), 256 (the values' chunks and the keys apart: the paper GAU's ``d_v = 1536``
takes the same tiles) and d 64; bf16, S = L = 512, each kernel's variants as ``make kernel-report`` compiles them.

Run from the repository root, once with the venv's Triton and once with the lent GPUs' (3.6.0, as ``make
kernel-report-device`` installs it):

    .venv/bin/python docs/kernel_analysis/2026-11-29/gradient_rows.py > docs/kernel_analysis/2026-11-29/gradient_rows_3.8.log
    PYTHONPATH=.triton/3.6.0 .venv/bin/python docs/kernel_analysis/2026-11-29/gradient_rows.py \\
        > docs/kernel_analysis/2026-11-29/gradient_rows_3.6.log

The ``_before`` logs are the same script on the session's base (91bfb74: the keys scaled per step's rows, the
codes' 32 rows), its tree first on the path: ``git worktree add /tmp/base 91bfb74``, then from ``/tmp/base`` the
same commands with ``PYTHONPATH=/tmp/base`` (and ``.triton/3.6.0`` of this checkout before it for 3.6), the script
and the logs named from this checkout.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import key_tiles  # noqa: E402 - this folder's script: its compile hook, SASS loop count and shared-memory model
import triton  # noqa: E402

from tvq_exp.attention.vq.fused import report  # noqa: E402
from tvq_exp.attention.vq.fused.config import Tiles, tiles  # noqa: E402

HEADS = ((128, 128), (128, 256), (64, 64))
# the check's case (S = L = 512, no XL bias, no sliding window): a tile of 128 keys is seen by the 128 rows of its
# diagonal band (masked: its first loop) and, on average over the block's four tiles, by 704 rows that see all of it
# (the whole loop: 192 of its own item's later rows, all 512 of the next item's)
MASKED_ROWS, WHOLE_ROWS = 128, 704
ROWS = (16, 32, 64)
STAGES = (1, 2)


def key_tile_work(per_thread: float, t: Tiles, d_k: int, d_v: int) -> str:
    """The instructions per thread over one key tile's rows, and the issue cycles of its warps (four schedulers a
    multiprocessor) per tensor-core cycle of its products (``2·d_k + 2·d_v`` multiply-adds per row and key: ``k·qᵀ``,
    ``v·dOᵀ``, ``dS·q``, ``Pᵀ·dO``), as ``key_tiles.py`` counts the forward's."""
    macs = (MASKED_ROWS + WHOLE_ROWS) * t.bn * (2 * d_k + 2 * d_v)
    issue = per_thread * t.num_warps / 4 / (macs / key_tiles.MACS_PER_CYCLE)
    return f"; per key tile {round(per_thread)}, issue / tensor cycles {issue:.2f}"


def main() -> None:
    report._row = key_tiles._grab
    here = os.path.dirname(
        report.__file__
    )  # the tree's commit, "+changes" where its kernels' folder differs from it
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True, text=True)
    changes = subprocess.run(
        ["git", "status", "--porcelain", "--", "."], cwd=here, capture_output=True, text=True
    )
    tree = commit.stdout.strip() + ("+changes" if changes.stdout.strip() else "")
    print(f"Triton {triton.__version__}, sm_90a, bf16, S = L = 512; the kernels of tree {tree}")
    for d_k, d_v in HEADS:
        for kernel, name, flags in report.variants(d_k, d_v, False):
            if kernel not in ("window_key", "code"):
                continue
            base = tiles(
                kernel, d_k, d_v, bias=bool(flags["HAS_BIAS"]), block=report.BLOCK, codes=report.CODES
            )
            for bm in ROWS:
                for stages in STAGES:
                    t = dataclasses.replace(base, bm=bm, num_stages=stages)
                    report.tiles = lambda *_, t=t, **__: t
                    r = report.compile_one(kernel, flags, d_k, d_v, "bf16")
                    compiled = key_tiles._captured["compiled"]
                    sizes = [size for size, _ in key_tiles.loops(compiled.asm["cubin"])]
                    mark = "*" if (bm, stages) == (base.bm, base.num_stages) else " "
                    tile = ""
                    # the keys' gradient in one pass without the bias: its loops are the masked rows, then the whole
                    if kernel == "window_key" and name == "dk+dv+whole":
                        tile = key_tile_work(
                            MASKED_ROWS * sizes[0] / bm + WHOLE_ROWS * sizes[1] / bm, t, d_k, d_v
                        )
                    print(f"{mark} d {d_k}/{d_v} {kernel} {name:12s} {bm}x{t.bn} w{t.num_warps} s{stages}: regs "
                          f"{r.registers} spills {r.spill_bytes} B smem {r.shared_bytes} B; per row "
                          f"{[round(s / bm, 2) for s in sizes]}{tile}; "
                          f"{'; '.join(key_tiles.shared_rates(compiled.asm['ttgir']))}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
