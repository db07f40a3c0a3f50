"""The nearest-code search in one Triton kernel: :func:`fused_nearest_code` computes
:func:`tvq_exp.quantize.kmeans.plain_nearest_code` (its reference; the tests hold the two equal) without writing
the ``(H, N, S)`` distances.

The plain search is three kernels per chunk of rows (a matmul, the ``||c||²`` add, the argmin), and on a GPU its
fp32 matmul runs on the CUDA cores: on one H100 (2026-11-27) 3.3 ms of a 13.7 ms VQ attention layer at 512k keys
per call, ``S = 512``, ``d_k = 128``. Here each program keeps ``BM`` rows in registers and streams the code tiles
past them, the products on the tensor cores:

- bf16 keys (what attention under bf16 autocast quantises) are read as they are. Each code is split into three bf16
  pieces whose fp32 sum is the code exactly (:func:`code_pieces`, by the caller before the op: ``S`` rows), and a
  key's product with a piece is exact in fp32, so the distance is the fp32 one, its sums in another order: three bf16
  products a tile.
  The same H100 took 1.3 ms for the search at 512k keys with the keys cast to fp32 and three tf32 passes: twice the
  tensor-core work, and each code tile split in the loop.
- other keys are cast to fp32 and take three tf32 passes (fp32's accuracy).

Under the interpreter the products are fp32 (bf16 pieces and keys are exact there).

Runs on CUDA (``tvq::nearest_code``, a custom op of the keys and the codebook's pieces: ``torch.compile`` keeps it in
its graph and fuses the pieces' making into the step's kernels) or on CPU under Triton's interpreter
(``TRITON_INTERPRET=1``: the tests).
"""

from __future__ import annotations

import functools
from pathlib import Path
from types import ModuleType

import torch
from torch import Tensor

from tvq_exp.nn.triton_loader import cdiv, load_kernels, padded_dim

# per keys' dtype: rows per program, codes per tile, warps, pipeline stages on sm_90 (make kernel-report, Triton 3.6
# and 3.8: no spills). fp32: the tiles the H100 of 2026-11-27 ran (Triton's default stages), 242 registers, 192 KiB
# of shared memory. bf16: 256 rows on two warpgroups share each tile of the three pieces, 134 registers, 208 KiB, 3
# stages: half the codebook reads from L2 of 128 rows (the codebook's 384 KiB of pieces read once a program). 128 x
# 128 on 8 warps issues 7-8% fewer instructions per key and code and reads a quarter less shared memory per product, at
# twice the codebook reads and 2 stages (docs/kernel_analysis/2026-11-29/nearest_pieces.py); a GPU decides between
# them (python -m tvq_exp.quantize.tune_nearest)
TILES = {torch.float32: (64, 64, 4, 3), torch.bfloat16: (256, 64, 8, 3)}
PIECES = {torch.float32: 1, torch.bfloat16: 3}
# codebook rows a program of the pieces' launch (at d = 128: 16 fp32 values a thread on 4 warps)
PIECE_ROWS = 16


def code_pieces(codes: Tensor, dtype: torch.dtype) -> Tensor:
    """The codes ``(H, S, d)`` fp32 as the search's pieces for keys of ``dtype``: ``(H, P, S, d)``, smallest first
    (the kernel adds them in that order), whose fp32 sum is ``codes`` exactly. fp32 keys: the codes as they are
    (``P = 1``). bf16 keys: three bf16 pieces (``P = 3``), each the rounding of what the larger ones leave: 8
    significant bits each, and an fp32 value has 24 (exact while the pieces are normal numbers: codes of magnitude
    over about 2^-100, or zero)."""
    if PIECES[dtype] == 1:
        return codes[:, None].contiguous()
    pieces, rest = [], codes
    for _ in range(PIECES[dtype]):
        piece = bf16_rounded(rest)
        pieces.append(piece)
        rest = rest - piece
    return torch.stack(pieces[::-1], 1)


def bf16_rounded(x: Tensor) -> Tensor:
    """``x`` (fp32, finite) rounded to bf16, to nearest even, by integer operations on the bits, then cast (exact).
    Inductor drops the rounding of a cast that it fuses with a cast back to fp32 (``emulate_precision_casts`` is off by
    default): the pieces made by the cast pair were zero after the first, and the compiled search read codes rounded to
    bf16 (found on CPU, 2026-11-30, after the H200's CUDA test of the compiled search failed in bf16). Eagerly the
    search takes its pieces from one kernel (:func:`launch_pieces`), which rounds by the same bits."""
    bits = x.view(torch.int32)
    return ((bits + (0x7FFF + ((bits >> 16) & 1))) & -0x10000).view(torch.float32).to(torch.bfloat16)


def search_dtype(keys: torch.dtype) -> torch.dtype:
    """The dtype the search reads keys of dtype ``keys`` in: bf16 keys as they are, any other as fp32."""
    return torch.bfloat16 if keys == torch.bfloat16 else torch.float32


def search_codes(codebook: Tensor, keys: torch.dtype) -> tuple[Tensor, Tensor]:
    """What the search reads of ``codebook (H, S, d)`` for keys of dtype ``keys``: the codes' squared norms ``(H, S)``
    fp32 and the pieces of ``-2·C`` ``(H, P, S, d)`` (:func:`code_pieces`), in fp32 whatever the autocast. The caller
    makes them, outside the search's op: under ``torch.compile`` torch's ops (10 for bf16 keys) fuse into the step's
    kernels; eagerly they are one launch (:data:`pieces_kernel`), where each was a launch of its own per layer and
    forward."""
    with torch.autocast(codebook.device.type, enabled=False):
        c = codebook.float()
        if not torch.compiler.is_compiling():
            return launch_pieces(c, search_dtype(keys))
        return (c * c).sum(-1).contiguous(), code_pieces(-2 * c, search_dtype(keys))


def launch_pieces(codebook: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """:func:`search_codes` of an fp32 ``codebook (H, S, d)`` for keys read in ``dtype`` in one launch: its ``c2``
    equals torch's up to the order of the ``d`` squares' sum, its pieces bit for bit."""
    h, s, d = codebook.shape
    codebook = codebook.contiguous()
    c2 = torch.empty(h, s, device=codebook.device)
    pieces = torch.empty(h, PIECES[dtype], s, d, device=codebook.device, dtype=dtype)
    rows = PIECE_ROWS
    if h * s:
        nearest_kernels(codebook.device.type == "cpu").pieces_kernel[(cdiv(h * s, rows),)](
            codebook, c2, pieces, h * s, s, d, BR=rows, DK=padded_dim(d), PIECES=PIECES[dtype], num_warps=4
        )  # fmt: skip
    return c2, pieces


def search(x: Tensor, c2: Tensor, pieces: Tensor) -> Tensor:
    """The search's one launch: ``x (H, N, d)`` against the codes of :func:`search_codes` (``c2 (H, S)``,
    ``pieces (H, P, S, d)``) -> the nearest code ``(H, N)`` int64. ``x`` may be strided (a copy is made only where
    its last dimension is not contiguous)."""
    interpret = x.device.type == "cpu"
    h, n, d = x.shape
    s = c2.shape[1]
    dtype = search_dtype(x.dtype)
    x = x.to(dtype)
    if x.stride(-1) != 1:
        x = x.contiguous()
    out = torch.empty(h, n, dtype=torch.long, device=x.device)
    if n == 0:
        return out
    bm, bs, warps, stages = TILES[dtype]
    nearest_kernels(interpret).nearest_kernel[(cdiv(n, bm), h)](
        x, pieces, c2, out, n, s, d, x.stride(0), x.stride(1),
        BM=bm, BS=bs, DK=padded_dim(d), PIECES=PIECES[dtype], DOT=dot_dtype(dtype, interpret),
        PREC="ieee" if interpret else "tf32x3", num_warps=warps, num_stages=stages,
    )  # fmt: skip
    return out


def fused_nearest_code(x: Tensor, codebook: Tensor) -> Tensor:
    """Index of the nearest code: ``x (H, N, d)``, ``codebook (H, S, d)`` -> ``(H, N)`` int64 (distances in fp32):
    :func:`search` of :func:`search_codes`."""
    return search(x, *search_codes(codebook, x.dtype))


@functools.cache
def nearest_kernels(interpret: bool) -> ModuleType:
    """:mod:`.nearest_kernel`, decorated for the interpreter or for the GPU (looked up once per mode: no path built per
    launch)."""
    return load_kernels(Path(__file__).with_name("nearest_kernel.py"), __package__, interpret)


def dot_dtype(dtype: torch.dtype, interpret: bool) -> object:
    """The products' operand type for keys of ``dtype``: bf16 for bf16 keys on a GPU; fp32 otherwise and under the
    interpreter (its bf16 products are wrong; bf16 pieces and keys are exact in fp32)."""
    import triton.language as tl

    return tl.bfloat16 if dtype == torch.bfloat16 and not interpret else tl.float32


@torch.library.custom_op("tvq::nearest_code", mutates_args=(), device_types=("cpu", "cuda"))
def nearest_code_op(x: Tensor, c2: Tensor, pieces: Tensor) -> Tensor:
    """:func:`search` as an op ``torch.compile`` keeps in its graph (CUDA, or CPU under the interpreter)."""
    return search(x, c2, pieces)


@nearest_code_op.register_fake
def _(x: Tensor, c2: Tensor, pieces: Tensor) -> Tensor:
    return x.new_empty(x.shape[:2], dtype=torch.long)


__all__ = [
    "bf16_rounded",
    "code_pieces",
    "fused_nearest_code",
    "launch_pieces",
    "nearest_code_op",
    "search",
    "search_codes",
    "search_dtype",
]
