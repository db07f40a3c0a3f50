"""Loads of the fused backward kernels at d 128, bf16, with 1 and 2 pipeline stages: synchronous ``tt.load``s and
asynchronous copies in the TTGIR; then the two configurations that keep 1 stage, with 2 (their spills):
``python docs/kernel_analysis/2026-11-28/pipelined_loads.py``."""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _compile import compile_with  # noqa: E402

from tvq_exp.attention.vq.fused.config import tiles  # noqa: E402

CASES = {
    "window_key": {"ONE_CHUNK": True, "DO_DK": True, "DO_DV": True, "HAS_BIAS": True, "WHOLE": False},
    "dq": {"HAS_CACHE": True, "HAS_BIAS": False, "BIAS_GRAD": False, "ONE_CHUNK": True, "WHOLE": True},
    "code": {"ONE_CHUNK": True, "DO_DK": True, "DO_DV": True, "HAS_BIAS": True, "WHOLE": False},
}
for kernel, flags in CASES.items():
    for stages in (1, 2):
        row, compiled = compile_with(tiles, kernel, flags, 128, 128, stages)
        ir = compiled.asm["ttgir"]
        print(f"{kernel} {stages} stage(s): regs {row.registers}, spills {row.spill_bytes} B, tt.load "
              f"{len(re.findall(r'tt[.]load ', ir))}, async copies {ir.count('async_copy_global_to_local')}",
              flush=True)  # fmt: skip

KEEP_ONE = {  # dq with the bias's gradient; the keys' gradient in one pass over whole tiles (d 128 and d 64)
    ("dq", 128): {"HAS_CACHE": True, "HAS_BIAS": True, "BIAS_GRAD": True, "ONE_CHUNK": True, "WHOLE": False},
    ("window_key", 128): {"ONE_CHUNK": True, "DO_DK": True, "DO_DV": True, "HAS_BIAS": False, "WHOLE": True},
    ("window_key", 64): {"ONE_CHUNK": True, "DO_DK": True, "DO_DV": True, "HAS_BIAS": False, "WHOLE": True},
}
for (kernel, d), flags in KEEP_ONE.items():
    for stages in (1, 2):
        row, _ = compile_with(tiles, kernel, flags, d, d, stages)
        print(f"{kernel} d {d}, {'bias' if flags['HAS_BIAS'] else 'whole'}, {stages} stage(s): regs {row.registers}, "
              f"spills {row.spill_bytes} B", flush=True)  # fmt: skip
