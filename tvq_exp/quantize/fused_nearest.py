"""The nearest-code search in one Triton kernel: :func:`fused_nearest_code` computes
:func:`tvq_exp.quantize.kmeans.nearest_code` (its plain reference; the tests hold the two equal) without writing
the ``(H, N, S)`` distances.

The plain search is three kernels per chunk of rows (a matmul, the ``||c||²`` add, the argmin), and on a GPU its
fp32 matmul runs on the CUDA cores: on one H100 (2026-11-27) 3.3 ms of a 13.7 ms VQ attention layer at 512k keys
per call, ``S = 512``, ``d_k = 128``. Here each program keeps ``BM`` rows in registers and streams the code tiles
past them, the product on the tensor cores in three tf32 passes (fp32's accuracy; exact fp32 under the interpreter).

Runs on CUDA (``tvq::nearest_code``, a custom op: ``torch.compile`` keeps it in its graph) or on CPU under Triton's
interpreter (``TRITON_INTERPRET=1``: the tests).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from tvq_exp.nn.triton_loader import cdiv, load_kernels, padded_dim

BM, BS = 64, 64  # rows per program, codes per tile
# Triton's default stages on sm_90 (as measured on the H100): 231 registers, no spills, 192 KiB of shared memory
# (make kernel-report)
NUM_WARPS, NUM_STAGES = 4, 3


def fused_nearest_code(x: Tensor, codebook: Tensor) -> Tensor:
    """Index of the nearest code: ``x (H, N, d)``, ``codebook (H, S, d)`` -> ``(H, N)`` int64 (distances in fp32)."""
    interpret = x.device.type == "cpu"
    h, n, d = x.shape
    s = codebook.shape[1]
    with torch.autocast(x.device.type, enabled=False):
        c = codebook.float()
        c2, scaled = (c * c).sum(-1).contiguous(), (-2 * c).contiguous()
    x = x.float().contiguous()
    out = torch.empty(h, n, dtype=torch.long, device=x.device)
    if n == 0:
        return out
    kernel = load_kernels(Path(__file__).with_name("nearest_kernel.py"), __package__, interpret).nearest_kernel
    kernel[(cdiv(n, BM), h)](
        x, scaled, c2, out, n, s, d,
        BM=BM, BS=BS, DK=padded_dim(d), PREC="ieee" if interpret else "tf32x3", num_warps=NUM_WARPS,
        num_stages=NUM_STAGES,
    )  # fmt: skip
    return out


@torch.library.custom_op("tvq::nearest_code", mutates_args=(), device_types="cuda")
def nearest_code_cuda(x: Tensor, codebook: Tensor) -> Tensor:
    """:func:`fused_nearest_code` on CUDA, as an op ``torch.compile`` keeps in its graph."""
    return fused_nearest_code(x, codebook)


@nearest_code_cuda.register_fake
def _(x: Tensor, codebook: Tensor) -> Tensor:
    return x.new_empty(x.shape[:2], dtype=torch.long)


__all__ = ["fused_nearest_code", "nearest_code_cuda"]
