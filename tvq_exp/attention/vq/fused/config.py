"""Tile sizes of the fused window + cache kernels, and the configurations shipped for the GPU.

One :class:`Tiles` per kernel: ``bm`` query rows by ``bn`` keys (or codes) per step, values ``bdv`` wide per
program (``d_v`` in chunks when wider: the GAU's ``d_v = 1536``), ``num_warps`` and ``num_stages`` (Triton's
software pipelining), and whether the tiles may load through tensor descriptors (``tma``). :func:`tiles` picks
them from the head sizes; :data:`SHIPPED` lists the head sizes whose configurations ``make kernel-report``
compiles for sm_90a (no register spills allowed, shared memory within an H100's 227 KB per block).
"""

from __future__ import annotations

from dataclasses import dataclass

from tvq_exp.nn.triton_loader import MIN_TILE, padded_dim

KERNEL_NAMES = ("forward", "dq", "window_key", "code")
H100_SHARED_BYTES = 232_448  # the most shared memory one block may take on sm_90 (227 KB)
# (d_k, d_v) the GPU path is sized for: the GPU check's attention heads (128, 128), wider values (d_v 256), the paper's
# GAU (d_v 1536) and small heads
SHIPPED = ((128, 128), (128, 256), (128, 1536), (64, 64))
# (wide, narrow) keys a step of the forward and of dq in one value chunk: wide where the blocks and the codebook hold
# whole tiles of them (keys_a_step)
WIDE_KEYS = {"forward": (128, 64), "dq": (64, 32)}


@dataclass(frozen=True)
class Tiles:
    """One kernel's launch shape: ``bm`` rows, ``bn`` keys, ``bdv`` value columns per program; ``tma``: the forward's
    and ``dq``'s key, value, code and mean tiles load through tensor descriptors (on the GPU the tensor-memory
    accelerator's bulk copies) where the call's tiles are whole (the op decides per call)."""

    bm: int
    bn: int
    bdv: int
    num_warps: int = 4
    num_stages: int = 1
    tma: bool = False


def tiles(
    kernel: str,
    d_k: int,
    d_v: int,
    interpret: bool = False,
    fp32: bool = False,
    bias: bool = False,
    block: int = 0,
    codes: int = 0,
    strided: bool = False,
) -> Tiles:
    """The tiles of ``kernel`` (one of :data:`KERNEL_NAMES`) for heads ``d_k, d_v`` and bf16/fp16 operands
    (``fp32``: fp32 operands, twice the bytes per tile; ``bias``: the XL bias is on, which sets the forward's and
    ``dq``'s key tiles and some of the backward's stages; ``block``, ``codes``: the call's keys per block ``L`` (0:
    not known) and codebook size ``S`` (0: no cache), which set the forward's and ``dq``'s key tiles:
    :func:`keys_a_step`; ``strided``: the keys' rows lie apart, several key heads innermost, which sets the rows a step
    of the keys' gradient). Under the interpreter the smallest tiles (its cost grows with the padding, not with the tile
    count on these test sizes), values in chunks of 16: a test with ``d_v > 16`` runs the chunked paths the GAU's
    ``d_v = 1536`` takes on a GPU.

    On the GPU, every product's rows are a multiple of 64 per warpgroup (four warps): a Hopper product (``wgmma``)
    is 64 rows per warpgroup, and a score tile that feeds the next product is laid out with all warps along its
    rows. So 64-row tiles take 4 warps and 128-row tiles 8; 64 rows on 8 warps would have both warpgroups compute
    the same scores and their softmax (``make kernel-report`` refuses it: its ``repeats`` column). Values go in
    chunks of 128 columns: a 256-wide chunk spills in every such tiling. fp32 operands (the GPU's correctness path)
    take one warpgroup, half the rows: their tiles' bytes fit a block's shared memory.

    ``tma`` (:func:`loads_by_descriptor`): the forward's and ``dq``'s wide key tiles; under the interpreter all their
    tiles, so that the tests load both ways (the op loads through descriptors only where every tile is whole, so never
    with the XL bias)."""
    dv = padded_dim(d_v)
    if interpret:
        return Tiles(MIN_TILE, MIN_TILE, MIN_TILE, tma=kernel in WIDE_KEYS)
    bdv, groups = min(dv, 128), 1 if fp32 else 2  # warpgroups along the products' rows
    # the forward: FlashAttention's layout, one warpgroup per 64 rows
    if kernel == "forward":
        keys = keys_a_step(kernel, d_k, fp32, bias, block, codes)
        tma = loads_by_descriptor(kernel, keys, d_k)
        return Tiles(64 * groups, keys, bdv, num_warps=4 * groups, num_stages=2, tma=tma)
    # the backward's loads are copied one step ahead (2 stages) where that does not spill: with 1 stage every load
    # of their loops is synchronous. It spills for dq with the bias's gradient at 128-wide keys
    one, wide_keys = dv <= bdv, padded_dim(d_k) > 64
    # dq: one warpgroup where the values fit one chunk (q, dO, dq all held), else dO·vᵀ summed 32 columns at a time
    if kernel == "dq":
        if one:
            keys = keys_a_step(kernel, d_k, fp32, bias, block, codes)
            stages, tma = 1 if bias and wide_keys else 2, loads_by_descriptor(kernel, keys, d_k)
            return Tiles(64, keys, bdv, num_warps=4, num_stages=stages, tma=tma)
        return Tiles(64 * groups, 32, 32, num_warps=4 * groups, num_stages=2)
    # window_key, code: 128 keys (or codes) per program, one warpgroup per 64, the keys (codes) held in registers, 2
    # stages; 64 rows a step, but 32 for the keys' and values' gradients in one pass of 128-wide keys (64 spill) and
    # for fp32 operands of 128-wide keys (64 overflow shared memory). More rows a step, fewer instructions per row and
    # products that read less shared memory: at 32 rows 96 bytes per tensor-core cycle, at 64 80 (docs/benchmarks.md).
    # Keys whose rows lie apart (several key heads innermost) take 16 in one pass: their addresses' registers spill 32
    # under Triton 3.6 (44 bytes; the lent GPUs' Triton), at 16 they compile with 246
    rows = 32 if wide_keys and (fp32 or (kernel == "window_key" and one)) else 64
    if strided and wide_keys and kernel == "window_key" and one and not fp32:
        rows = 16
    return Tiles(rows, 64 * groups, bdv, num_warps=4 * groups, num_stages=2)


def keys_a_step(kernel: str, d_k: int, fp32: bool, bias: bool, block: int, codes: int) -> int:
    """The keys (and codes) a step of the forward or of ``dq`` in one value chunk: 32 with the XL bias (its gather
    and its gradient's scatter need the registers); else the wide tile of :data:`WIDE_KEYS` for bf16/fp16 operands,
    keys at most 128 wide, and blocks and a codebook of whole tiles of it (``block``, ``codes``; ``codes`` 0: no
    cache), else the narrow one (fp32 operands' wide tiles would overflow a block's shared memory; a block of part
    of a tile would compute masked keys). The wide tiles take a fifth to a quarter fewer instructions per item in
    the compiled loops (the accumulator's rescaling, the row maxima's exchanges and the loop's own work are per
    tile), and ``dq``'s products read a fifth less shared memory per multiply-add, without spills under Triton 3.6 or
    3.8 (docs/benchmarks.md, "The forward's and dq's wider key tiles")."""
    if bias:
        return 32
    wide, narrow = WIDE_KEYS[kernel]
    fits = block > 0 and block % wide == 0 and codes % wide == 0
    return wide if fits and not fp32 and padded_dim(d_k) <= 128 else narrow


def loads_by_descriptor(kernel: str, keys: int, d_k: int) -> bool:
    """Whether the forward's or ``dq``'s (in one value chunk) tiles of ``keys`` keys ``d_k`` wide load through tensor
    descriptors on the GPU: the wide key tiles (:func:`keys_a_step`: never with the XL bias), for ``dq`` of keys wider
    than 64. Compiled for sm_90a (Triton 3.6 and 3.8) at d 128, one item's loops take 4-5% (the forward) and 16%
    (``dq``) fewer instructions than by pointers, with 20 to 40 fewer registers: one thread issues a tile's bulk copy,
    where every thread computed its addresses and issued its share of the copies. At d 64 the forward's take 2-4% fewer,
    ``dq``'s 3-4% more. The bias's 32-key tiles take more instructions through them, and ``dq``'s spill under 3.8
    (docs/benchmarks.md, "Key tiles through the tensor-memory accelerator")."""
    return keys == WIDE_KEYS[kernel][0] and (kernel == "forward" or padded_dim(d_k) > 64)


__all__ = [
    "H100_SHARED_BYTES",
    "KERNEL_NAMES",
    "SHIPPED",
    "WIDE_KEYS",
    "Tiles",
    "keys_a_step",
    "loads_by_descriptor",
    "padded_dim",
    "tiles",
]
