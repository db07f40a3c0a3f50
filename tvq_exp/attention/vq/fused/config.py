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


def tiles(
    kernel: str, d_k: int, d_v: int, interpret: bool = False, fp32: bool = False, bias: bool = False
) -> Tiles:
    """The tiles of ``kernel`` (one of :data:`KERNEL_NAMES`) for heads ``d_k, d_v`` and bf16/fp16 operands
    (``fp32``: fp32 operands, twice the bytes per tile; ``bias``: the XL bias is on, which sets the forward's key
    tile and some of the backward's stages). Under the interpreter the smallest tiles (its cost grows with the
    padding, not with the tile count on these test sizes), values in chunks of 16: a test with ``d_v > 16`` runs the
    chunked paths the GAU's ``d_v = 1536`` takes on a GPU.

    On the GPU, every product's rows are a multiple of 64 per warpgroup (four warps): a Hopper product (``wgmma``)
    is 64 rows per warpgroup, and a score tile that feeds the next product is laid out with all warps along its
    rows. So 64-row tiles take 4 warps and 128-row tiles 8; 64 rows on 8 warps would have both warpgroups compute
    the same scores and their softmax (``make kernel-report`` refuses it: its ``repeats`` column). Values go in
    chunks of 128 columns: a 256-wide chunk spills in every such tiling. fp32 operands (the GPU's correctness path)
    take one warpgroup, half the rows: their tiles' bytes fit a block's shared memory."""
    dv = padded_dim(d_v)
    if interpret:
        return Tiles(MIN_TILE, MIN_TILE, MIN_TILE)
    bdv, groups = min(dv, 128), 1 if fp32 else 2  # warpgroups along the products' rows
    # the forward: FlashAttention's layout, one warpgroup per 64 rows; 32 keys a step with the bias's gather
    if kernel == "forward":
        return Tiles(64 * groups, 32 if bias else 64, bdv, num_warps=4 * groups, num_stages=2)
    # the backward's loads are copied one step ahead (2 stages) where that does not spill: with 1 stage every load
    # of their loops is synchronous. It spills for dq with the bias's gradient at 128-wide keys, and for the keys'
    # gradient in one pass over whole tiles (no bias) at 64-wide keys (Triton 3.6)
    one, wide_keys = dv <= bdv, padded_dim(d_k) > 64
    # dq: one warpgroup where the values fit one chunk (q, dO, dq all held), else dO·vᵀ summed 32 columns at a time
    if kernel == "dq":
        if one:
            return Tiles(64, 32, bdv, num_warps=4, num_stages=1 if bias and wide_keys else 2)
        return Tiles(64 * groups, 32, 32, num_warps=4 * groups, num_stages=2)
    # window_key, code: 128 keys (or codes) per program, one warpgroup per 64; 32 rows a step for 128-wide keys (64
    # rows spill), 16 for their keys' and values' gradients in one pass (32 spill there under Triton 3.6, the lent
    # GPUs' version: make kernel-report-device)
    rows = 64 if not wide_keys else 16 if kernel == "window_key" and one else 32
    stages = 1 if kernel == "window_key" and one and not bias and not wide_keys else 2
    return Tiles(rows, 64 * groups, bdv, num_warps=4 * groups, num_stages=stages)


__all__ = ["H100_SHARED_BYTES", "KERNEL_NAMES", "SHIPPED", "Tiles", "padded_dim", "tiles"]
