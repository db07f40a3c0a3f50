"""Tensor-core work executed per useful multiply-add of each fused kernel, the tiles before this session (e321243's
config.py) against the shipped ones: ``python docs/kernel_analysis/2026-11-28/repeated_products.py``."""

from __future__ import annotations

import subprocess
import sys
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _compile import compile_with, executed_per_useful  # noqa: E402

from tvq_exp.attention.vq.fused import report as R  # noqa: E402
from tvq_exp.attention.vq.fused.config import tiles as shipped  # noqa: E402

source = subprocess.run(["git", "show", "e321243:tvq_exp/attention/vq/fused/config.py"], capture_output=True,
                        text=True, check=True).stdout  # fmt: skip
old = types.ModuleType("old_config")
sys.modules["old_config"] = old
exec(compile(source, "old_config.py", "exec"), old.__dict__)


def before(kernel: str, d_k: int, d_v: int, fp32: bool = False, bias: bool = False):
    return old.tiles(kernel, d_k, d_v, fp32=fp32)


for d_k, d_v in ((128, 128), (128, 256), (128, 1536), (64, 64)):
    for kernel, name, flags in R.variants(d_k, d_v, False):
        cells = []
        for label, tiles in (("before", before), ("now", shipped)):
            row, compiled = compile_with(tiles, kernel, flags, d_k, d_v)
            t = row.tiles
            ratio = executed_per_useful(compiled.asm["ttgir"])
            cells.append(f"{label} {t.bm}x{t.bn}x{t.bdv} w{t.num_warps}: {ratio:.2f}")
        print(f"{kernel} {name} ({d_k}, {d_v}) | " + " | ".join(cells), flush=True)
