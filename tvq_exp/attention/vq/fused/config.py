"""Tile sizes of the fused window + cache kernels, and the configurations shipped for the GPU.

One :class:`Tiles` per kernel: ``bm`` query rows by ``bn`` keys (or codes) per step, values ``bdv`` wide per
program (``d_v`` in chunks when wider: the GAU's ``d_v = 1536``), ``num_warps`` and ``num_stages`` (Triton's
software pipelining). :func:`tiles` picks them from the head sizes; :data:`SHIPPED` lists the head sizes whose
configurations ``make kernel-report`` compiles for sm_90a (no register spills allowed, shared memory within
an H100's 227 KB per block).
"""

from __future__ import annotations

from dataclasses import dataclass

from tvq_exp.nn.triton_loader import MIN_TILE, padded_dim

KERNEL_NAMES = ("forward", "dq", "window_key", "code")
H100_SHARED_BYTES = 232_448  # the most shared memory one block may take on sm_90 (227 KB)
# (d_k, d_v) the GPU path is sized for: the GPU check's attention heads (128, 128), wider values (d_v 256), the paper's
# GAU (d_v 1536) and small heads
SHIPPED = ((128, 128), (128, 256), (128, 1536), (64, 64))


@dataclass(frozen=True)
class Tiles:
    """One kernel's launch shape: ``bm`` rows, ``bn`` keys, ``bdv`` value columns per program."""

    bm: int
    bn: int
    bdv: int
    num_warps: int = 4
    num_stages: int = 1


def tiles(kernel: str, d_k: int, d_v: int, interpret: bool = False, fp32: bool = False) -> Tiles:
    """The tiles of ``kernel`` (one of :data:`KERNEL_NAMES`) for heads ``d_k, d_v`` and bf16/fp16 operands
    (``fp32``: fp32 operands, twice the bytes per tile). Under the interpreter the smallest tiles (its cost grows
    with the padding, not with the tile count on these test sizes), values in chunks of 16: a test with ``d_v > 16``
    runs the chunked paths the GAU's ``d_v = 1536`` takes on a GPU."""
    dv = padded_dim(d_v)
    if interpret:
        return Tiles(MIN_TILE, MIN_TILE, MIN_TILE)
    if kernel == "forward":  # the values in one chunk up to 256 (128 for fp32): the scores once per chunk
        return Tiles(64, 64, min(dv, 128 if fp32 else 256), num_warps=8, num_stages=2)
    # dq, window_key, code: values in chunks of 128 (the keys' gradient, dp over all chunks, apart past 128)
    bdv = min(dv, 128)
    if kernel == "dq":  # 32 keys per step; one warpgroup where the values fit one chunk (q, dO, dq all held)
        return Tiles(64, 32, bdv, num_warps=4 if dv <= bdv else 8, num_stages=1)
    # the keys' gradients in one pass (values of one chunk) and 128-wide keys: 32 rows a step, else they spill
    if kernel == "window_key" and dv <= bdv and padded_dim(d_k) > 64:
        return Tiles(32, 64, bdv, num_warps=8, num_stages=1)
    return Tiles(64, 64, bdv, num_warps=8, num_stages=1)


__all__ = ["H100_SHARED_BYTES", "KERNEL_NAMES", "SHIPPED", "Tiles", "padded_dim", "tiles"]
