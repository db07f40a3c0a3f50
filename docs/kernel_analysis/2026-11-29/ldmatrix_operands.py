"""Where each product of the shipped bf16 kernels (d_k = d_v = 128, S = L = 512, every variant ``make kernel-report``
compiles) takes its first operand from, compiled for sm_90a by whichever Triton is first on the path, and the
shared-memory bytes the products read per tensor-core cycle by ``key_tiles.py``'s model, before and after its
correction of the twentieth session.

Until then the model took a first operand held as a register tensor (``dot_op`` layout in the TTGIR) to be read from
registers. Triton often keeps such an operand in shared memory and loads it for each product with ``ldmatrix``
(``ttg.local_load`` in the loop body, ``LDSM`` in the SASS): the forward's and ``dq``'s queries, the keys of the
keys' gradient, the codes of the codes' gradient, the search's keys. Those bytes are read from shared memory all the
same. Per product: ``MxK(a)·KxN``, ``a`` one of ``smem`` (the tensor cores read it), ``ldsm`` (loaded by ``ldmatrix``
in the loop), ``regs`` (computed in registers, or loaded once outside the loop).

Run from the repository root, once with the venv's Triton and once with the lent GPUs' (3.6.0, as ``make
kernel-report-device`` installs it):

    .venv/bin/python docs/kernel_analysis/2026-11-29/ldmatrix_operands.py > docs/kernel_analysis/2026-11-29/ldmatrix_operands_3.8.log
    PYTHONPATH=.triton/3.6.0 .venv/bin/python docs/kernel_analysis/2026-11-29/ldmatrix_operands.py \\
        > docs/kernel_analysis/2026-11-29/ldmatrix_operands_3.6.log
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import key_tiles  # noqa: E402 - this folder's script: its compile hook and shared-memory model
import triton  # noqa: E402

from tvq_exp.attention.vq.fused import report  # noqa: E402


def uncorrected(rates: list[str], ttgir: str) -> str:
    """The model's total as it was: ``ldsm`` operands counted as registers."""
    old = key_tiles.shared_rates(re.sub(r"ttg\.local_load", "ttg.local_load_", ttgir))
    return old[-1].removeprefix("all products: ")


def main() -> None:
    report._row = key_tiles._grab
    here = os.path.dirname(report.__file__)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True, text=True)
    print(
        f"Triton {triton.__version__}, sm_90a, bf16, d_k = d_v = 128; the kernels of tree {commit.stdout.strip()}"
    )
    for kernel, name, flags in report.variants(128, 128, False):
        row = report.compile_one(kernel, flags, 128, 128, "bf16")
        ttgir = key_tiles._captured["compiled"].asm["ttgir"]
        rates = key_tiles.shared_rates(ttgir)
        t = row.tiles
        print(
            f"{kernel} {name:11s} {t.bm}x{t.bn} w{t.num_warps}: {'; '.join(rates)} (counting ldsm as registers: "
            f"{uncorrected(rates, ttgir)})",
            flush=True,
        )


if __name__ == "__main__":
    main()
