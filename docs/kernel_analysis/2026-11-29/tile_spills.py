"""Registers and spills of candidate tiles, compiled for sm_90a by whichever Triton is first on the path.

Run from the repository root, once with the venv's Triton and once with the lent GPUs' (3.6.0, as
``make kernel-report-device`` installs it):

    .venv/bin/python docs/kernel_analysis/2026-11-29/tile_spills.py > docs/kernel_analysis/2026-11-29/tile_spills_3.8.log
    PYTHONPATH=.triton/3.6.0 .venv/bin/python docs/kernel_analysis/2026-11-29/tile_spills.py \
        > docs/kernel_analysis/2026-11-29/tile_spills_3.6.log

The cases: the window keys' and values' gradient in one pass at d_k = d_v = 128 (the GPU check's attention heads),
with the XL bias and without it (whole tiles), and the running code means' forward kernel with bf16 and fp32 values.
"""

from __future__ import annotations

import triton

from tvq_exp.attention.vq.fused import config, prefix, report
from tvq_exp.attention.vq.fused.config import Tiles

# (rows a step, keys a program, warps, stages); (codes, positions a step, columns, warps, stages)
WINDOW_KEY = ((32, 128, 8, 1), (32, 128, 8, 2), (16, 128, 8, 1), (16, 128, 8, 2), (32, 64, 4, 1), (32, 64, 4, 2),
              (16, 64, 4, 2), (64, 128, 8, 1))  # fmt: skip
MEANS_FORWARD = ((128, 64, 32, 8, 2), (128, 64, 32, 8, 1), (128, 32, 32, 8, 2), (128, 64, 16, 8, 2))


def main() -> None:
    print(f"Triton {triton.__version__}, sm_90a")
    shipped_tiles = report.tiles
    for kernel, flags, const in report.variants(128, 128, False):
        if kernel != "window_key":
            continue
        for bm, bn, warps, stages in WINDOW_KEY:
            t = Tiles(bm, bn, config.tiles(kernel, 128, 128).bdv, warps, stages)
            report.tiles = lambda *_, t=t, **__: t
            r = report.compile_one(kernel, const, 128, 128, "bf16")
            print(f"window_key {flags:12s} {bm}x{bn}x{t.bdv} warps {warps} stages {stages}: "
                  f"regs {r.registers} spills {r.spill_bytes} B smem {r.shared_bytes} B")  # fmt: skip
    report.tiles = shipped_tiles
    shipped_means, shipped_stages = dict(prefix.GPU_TILES), prefix.STAGES
    for bs, bt, bd, warps, stages in MEANS_FORWARD:
        prefix.GPU_TILES["forward"], prefix.STAGES = (bs, bt, bd, warps), stages
        for dtype in ("bf16", "fp32"):
            r = report.compile_prefix("forward", dtype)
            print(f"means forward {dtype} {bs}x{bt}x{bd} warps {warps} stages {stages}: "
                  f"regs {r.registers} spills {r.spill_bytes} B smem {r.shared_bytes} B")  # fmt: skip
    prefix.GPU_TILES.update(shipped_means)
    prefix.STAGES = shipped_stages


if __name__ == "__main__":
    main()
