"""Shared by the scripts here: compile one fused-kernel configuration for sm_90a through make kernel-report's code
and keep Triton's compiled object (TTGIR, PTX). Run from the repository root with the venv's python."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable

from tvq_exp.attention.vq.fused import report as R
from tvq_exp.attention.vq.fused.config import Tiles

_captured: dict[str, object] = {}
_row = R._row


def _grab(kernel: str, d_k: int, d_v: int, dtype: str, t: Tiles, compiled: object) -> R.Row:
    _captured["compiled"] = compiled
    return _row(kernel, d_k, d_v, dtype, t, compiled)


R._row = _grab


def compile_with(
    tiles: Callable[..., Tiles], kernel: str, flags: dict, d_k: int, d_v: int, stages: int | None = None
):
    """``(Row, compiled)`` of ``kernel`` with ``flags`` at heads ``d_k, d_v``, bf16, tiles from ``tiles(kernel, d_k, d_v,
    fp32=..., bias=...)`` (``stages``: that many pipeline stages instead)."""

    def pick(k: str, a: int, b: int, fp32: bool = False, bias: bool = False, **sizes: int) -> Tiles:
        # the tiles of before the seventeenth session, which took no block or codebook size (so the scripts here
        # reproduce their logs: the forward's 64 keys, dq's 32)
        t = tiles(k, a, b, fp32=fp32, bias=bias)
        return t if stages is None else dataclasses.replace(t, num_stages=stages)

    R.tiles = pick
    # the loads masked unless the caller says (the kernels took no EVEN before the thirteenth session)
    row = R.compile_one(kernel, {"EVEN": False, **flags}, d_k, d_v, "bf16")
    return row, _captured["compiled"]


PRODUCT = re.compile(
    r"warp_group_dot [^\n]*?: (?:tensor|!ttg\.memdesc)<(\d+)x(\d+)x\w+, [^\n]*-> tensor<(\d+)x(\d+)x\w+, (#mma\d*)>"
)


def executed_per_useful(ttgir: str) -> float:
    """Tensor-core multiply-adds executed per useful one over a kernel's Hopper products (each product's tile ``M×K·N``
    times how often its layout repeats it: :func:`~tvq_exp.attention.vq.fused.report.repeats`' rule)."""
    layouts = {m[1]: (int(m[2]), int(m[3]), int(m[4])) for m in R.HOPPER_LAYOUT.finditer(ttgir)}
    useful = executed = 0
    for m in PRODUCT.finditer(ttgir):
        rows, k, _, cols, lay = int(m[1]), int(m[2]), int(m[3]), int(m[4]), m[5]
        wm, wn, n = layouts[lay]
        rep = max(1, 16 * wm // rows) * max(1, wn * n // cols)
        useful += rows * cols * k
        executed += rep * rows * cols * k
    return executed / useful


def loop_instructions(ptx: str) -> list[int]:
    """PTX instructions per thread in each basic block that issues a ``wgmma`` (the loop bodies), in order."""
    blocks = re.split(r"\n(\$L__BB\d+_\d+):", ptx)
    sizes = []
    for body in blocks[2::2]:
        lines = [x.strip() for x in body.split("\n")]
        ins = [x for x in lines if x and not x.startswith(("//", "$", "{", "}"))]
        if any("wgmma" in x for x in ins):
            sizes.append(len(ins))
    return sizes
