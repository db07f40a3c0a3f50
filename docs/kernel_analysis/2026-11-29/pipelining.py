"""How the Triton first on the path pipelines the shipped bf16 configurations at the GPU check's heads (d_k = d_v =
128): synchronous ``tt.load``s and asynchronous copies in the TTGIR, products issued asynchronously, and PTX
instructions per thread in each loop body that issues a ``wgmma``. Run it as ``tile_spills.py`` (its docstring),
once per Triton; the logs beside it are ``pipelining_3.8.log`` and ``pipelining_3.6.log``."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import triton

sys.path.insert(0, str(Path(__file__).parents[1] / "2026-11-28"))
from _compile import compile_with, loop_instructions  # noqa: E402

from tvq_exp.attention.vq.fused import report  # noqa: E402
from tvq_exp.attention.vq.fused.config import tiles  # noqa: E402

print(f"Triton {triton.__version__}, sm_90a, bf16, d_k = d_v = 128, the shipped tiles")
for kernel, flags, const in report.variants(128, 128, False):
    row, compiled = compile_with(tiles, kernel, const, 128, 128)
    ir, ptx = compiled.asm["ttgir"], compiled.asm["ptx"]
    t = row.tiles
    print(f"{kernel:10s} {flags:12s} {t.bm}x{t.bn}x{t.bdv} w{t.num_warps} s{t.num_stages}: regs {row.registers}, "
          f"spills {row.spill_bytes} B, tt.load {len(re.findall(r'tt[.]load ', ir))}, async copies "
          f"{ir.count('async_copy_global_to_local')}, async products {ir.count('isAsync = true')}, "
          f"loop bodies {loop_instructions(ptx)}", flush=True)  # fmt: skip
