"""The running code means' four kernels as the Triton first on the path compiles them for sm_90a (bf16 values, their
GPU tiles): registers, the synchronous ``tt.load``s inside loops of the TTGIR (a load a loop waits for at each step,
where an asynchronous copy is issued a step ahead), the asynchronous copies, and the fp64 divisions in the PTX (each a
long instruction sequence at the fp64 rate). Twenty-fifth session: the block sums' loop loaded the int8 padding mask
synchronously (now the op masks the codes before the launch) and the forward walk divided every cell (now one
reciprocal a code). Run from the repository root: ``.venv/bin/python docs/kernel_analysis/2026-11-29/means_loads.py``,
and with ``PYTHONPATH=.triton/3.6.0`` for the lent GPUs' Triton (``make kernel-report-device`` installs it); the logs
beside it are ``means_loads_3.8.log`` and ``means_loads_3.6.log``."""

from __future__ import annotations

import re

import triton

from tvq_exp.attention.vq.fused import report

compiled: dict[str, object] = {}
_row = report._row


def _keep(kernel: str, d_k: int, d_v: int, dtype: str, t: object, c: object) -> report.Row:
    compiled["last"] = c
    return _row(kernel, d_k, d_v, dtype, t, c)


def loop_loads(ttgir: str) -> int:
    """The synchronous ``tt.load``s inside ``scf.for`` bodies (nesting followed by braces)."""
    depth, loads, loops = 0, 0, []
    for line in ttgir.splitlines():
        if "scf.for" in line and line.rstrip().endswith("{"):
            loops.append(depth)
        if loops and re.search(r"= tt[.]load ", line):
            loads += 1
        depth += line.count("{") - line.count("}")
        while loops and depth <= loops[-1]:
            loops.pop()
    return loads


report._row = _keep
print(f"Triton {triton.__version__}, sm_90a, bf16 values, the means' GPU tiles")
for kernel in ("sums", "forward", "backward", "rows"):
    row = report.compile_prefix(kernel, "bf16")
    ir, ptx = compiled["last"].asm["ttgir"], compiled["last"].asm["ptx"]
    print(f"means {kernel:8s} registers {row.registers:3d}, spills {row.spill_bytes} B, synchronous loads in loops "
          f"{loop_loads(ir)}, asynchronous copies {ir.count('async_copy_global_to_local')}, fp64 divisions "
          f"{len(re.findall(r'div[.]rn[.]f64', ptx))}", flush=True)  # fmt: skip
