"""PTX instructions per thread in the loop bodies of the four fused kernels at d 128, bf16, no XL bias, whole tiles,
with the loads masked (``EVEN`` False: what every shape took before the thirteenth session) and unmasked (``EVEN``
True: the shipped heads since): ``python docs/kernel_analysis/2026-11-28/even_loads.py``. The counts leave out
PTX's ``.loc`` debug lines, which ``loop_instructions.py`` counts."""

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
    "code": {"ONE_CHUNK": True, "DO_DK": True, "DO_DV": True},
}
ORDER = """basic blocks that issue a wgmma, in the compiled order. forward, dq: the 1st the masked tiles before the whole
ones, the 3rd the whole tiles, the 5th the masked ones after them, the 7th the cache's. window_key: the row blocks
that see the key tile, masked, whole, masked. code: the row blocks of the item."""
print(ORDER)
for kernel, flags in CASES.items():
    rows = []
    for even in (False, True):
        row, compiled = compile_with(tiles, kernel, flags | {"EVEN": even}, 128, 128)
        ptx = "\n".join(x for x in compiled.asm["ptx"].splitlines() if not x.strip().startswith(".loc"))
        rows.append((even, loop_instructions(ptx), row.registers))
    t = row.tiles
    for even, counts, regs in rows:
        print(f"{kernel} {t.bm}x{t.bn}x{t.bdv} w{t.num_warps} s{t.num_stages} EVEN={even}: {counts}, {regs} registers",
              flush=True)  # fmt: skip
