"""PTX instructions per thread in the loop bodies of the fused kernels at d 128, bf16, no XL bias, whole tiles
(``WHOLE``): the masked runs and the whole run, in the order the compiled code has them:
``python docs/kernel_analysis/2026-11-28/loop_instructions.py``."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _compile import compile_with, loop_instructions  # noqa: E402

from tvq_exp.attention.vq.fused.config import tiles  # noqa: E402

CASES = {
    "forward": {"HAS_CACHE": True, "HAS_BIAS": False, "WHOLE": True},
    "dq": {"HAS_CACHE": True, "HAS_BIAS": False, "BIAS_GRAD": False, "ONE_CHUNK": True, "WHOLE": True},
    "window_key": {"ONE_CHUNK": True, "DO_DK": True, "DO_DV": True, "HAS_BIAS": False, "WHOLE": True},
}
for kernel, flags in CASES.items():
    row, compiled = compile_with(tiles, kernel, flags, 128, 128)
    t = row.tiles
    print(f"{kernel} {t.bm}x{t.bn}x{t.bdv} w{t.num_warps} s{t.num_stages}: loop bodies (instructions per thread, in "
          f"order) {loop_instructions(compiled.asm['ptx'])}", flush=True)  # fmt: skip
