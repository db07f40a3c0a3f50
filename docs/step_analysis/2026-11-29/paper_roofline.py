"""What the paper step's own work allows on a GPU, counted on the CPU: one ``experiment=enwik8_paper`` GAU (d_model
768, d_k 128, d_v 1536, S = L = 512, XL bias, the cache with its gradient, dropout and LayerDrop) on a 2048-token
update of 8 sequences in the middle of a TBPTT sequence (a carried state: the window's previous block and a full
cache), forward and backward under bf16 autocast, as the GPU path runs it: ``kernel=auto`` there takes the plain
kernel's GEMMs at ``d_v`` 1536 (with cuBLAS's fp32 outputs of bf16 operands), the fused running means and the
fused code search. Counted on fake tensors (no memory, no kernel runs), op by op: the FLOPs of every GEMM
(``mm``, ``bmm``, ``addmm``, ``baddbmm``; the fused means by their products) and the bytes every other op reads and
writes (views and allocations are free; an expanded dimension counts one element). Then the step's 48 blocks, the
output head and loss, and the fused AdamW's bytes, against the model's FLOP count (what ``throughput/mfu``
divides), give three floors of the step's device time: the GEMMs at the device's measured matmul rate, the other
bytes at its memory bandwidth, and the kernel launches at a few microseconds each.

Eager counts are an upper bound of the bytes: compiled, inductor fuses chains of pointwise ops into one pass (the
per-op rows show which chains). The GEMMs' FLOPs are exact for the plain path.

Run from the repository root: ``TRITON_INTERPRET=1 .venv/bin/python docs/step_analysis/2026-11-29/paper_roofline.py``
(about a minute; the interpreter only lets the fused means be built on a CPU: no kernel runs).
"""

from __future__ import annotations

import collections
import os
import sys
import traceback
from pathlib import Path
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

sys.path.insert(0, str(Path.cwd()))
os.environ.setdefault("TVQ_DATA_DIR", str(Path.cwd().parent / "shared" / "datasets"))

from hydra.utils import instantiate  # noqa: E402

import tvq_exp.attention.vq.kernel as kernel_module  # noqa: E402
import tvq_exp.attention.vq.layer as layer_module  # noqa: E402
import tvq_exp.quantize.codebook as codebook_module  # noqa: E402
from tests.helpers.config import compose_config  # noqa: E402

sys.path.insert(0, str(Path(__file__).parents[1] / "2026-11-28"))
import layer_traffic  # noqa: E402  (its byte count of a tensor and its lists of free and overwriting ops)

BATCH, TOKENS, LAYERS = 8, 2048, 48
# the paper's model and data (two of its blocks: the second is counted, then multiplied by LAYERS)
PAPER_BLOCK = [
    "experiment=enwik8_paper",
    "trainer=cpu",
    "global_batch_size=null",
    "model.n_layers=2",
    "data=kjv",
]
# layer_traffic.py's free ops (views, allocations: an allocation's bytes count where it is written), and the
# allocations the block's ops add
FREE = (*layer_traffic.FREE, "aten::empty_like", "aten::empty_strided", "aten::zeros_like")
GEMMS = ("aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm")
# the 8192³ bf16 matmul rate measured on the H200 of 2026-11-28 (TFLOP/s; the H100 SXM has the same tensor cores), the
# datasheet's dense bf16 peak of both, and their memory bandwidths (TB/s)
MATMUL, PEAK = 746, 989
BANDWIDTH = {"H100 SXM": 3.35, "H200": 4.8}


def gemm_flops(name: str, args: tuple, out: torch.Tensor) -> int:
    """2·m·n·k (times the batch) of a GEMM whose result is ``out``."""
    a = args[1] if name in ("aten::addmm", "aten::baddbmm") else args[0]
    return 2 * out.numel() * a.shape[-1]


def where(frames: list[traceback.FrameSummary]) -> str:
    """The innermost frame of this repository (``file:line``), or ``autograd`` (a derivative torch wrote)."""
    ours = [f for f in frames if "/tvq_exp/" in f.filename]
    return f"{ours[-1].filename.split('tvq_exp/')[-1]}:{ours[-1].lineno}" if ours else "autograd"


class Count(TorchDispatchMode):
    """``(phase, place, op, FLOPs, bytes read + written)`` of every op that computes or moves data."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple[str, str, str, int, int]] = []
        self.phase = "forward"

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        name = func._schema.name
        if func.is_view or name in FREE:
            return out
        results = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        read = [t for t in tree_flatten((args[1:] if name in layer_traffic.OVERWRITE else args, kwargs))[0]]
        size = sum(layer_traffic.touched(t) for t in [*read, *results] if isinstance(t, torch.Tensor))
        flops = gemm_flops(name, args, results[0]) if name in GEMMS else 0
        if name == "tvq::code_means":  # the fused running means: one (S × L)·(L × d_v) product per block
            values = args[1]
            flops = (
                2 * values.shape[0] * values.shape[1] * values.shape[2] * values.shape[3] * args[0].shape[-1]
            )
        self.rows.append((self.phase, where(traceback.extract_stack()[:-1]), name, flops, size))
        return out


def cuda_matmul(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, add: bool = False) -> None:
    """The plain kernel's products as on a GPU: bf16 operands into an fp32 result (``kernel._matmul``'s CUDA
    branch), where a CPU would widen the operands first."""
    if a.dtype != out.dtype and a.dtype == b.dtype:
        flat = (x.reshape(-1, *x.shape[-2:]) for x in (a, b))
        prod = torch.bmm(*flat, out_dtype=out.dtype).view(out.shape)
        out.add_(prod) if add else out.copy_(prod)
    else:
        PLAIN_MATMUL(a, b, out, add)


PLAIN_MATMUL = kernel_module._matmul


def gpu_path() -> None:
    """What ``kernel=auto`` takes on a GPU at the paper's widths, on CPU tensors, in the GPU's chunks."""
    kernel_module._matmul = cuda_matmul
    kernel_module.CHUNK_BYTES["cpu"] = kernel_module.CHUNK_BYTES["cuda"]  # every item in one chunk
    layer_module.VQAttention.window_kernel = lambda self, q, k, v, per_item: "plain"
    layer_module.VQAttention.means_kernel = lambda self, values: "triton"
    codebook_module.nearest_code = lambda x, c: torch.ops.tvq.nearest_code(x.detach(), c.detach())
    codebook_module.fused_search = lambda x: True


def count_block() -> tuple[list[tuple[str, str, str, int, int]], int, int, int, int]:
    """One paper GAU's forward and backward rows on a mid-sequence update; its parameters, the model's FLOPs per
    block (forward + backward), and the output head's FLOPs and parameters."""
    overrides = PAPER_BLOCK
    with FakeTensorMode(allow_non_fake_inputs=True):
        model = instantiate(compose_config("train", overrides).model).train()
        block = model.blocks[1]
        x0 = torch.randn(BATCH, TOKENS, block.d_model)
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            state = block(x0, None)[1]  # the carried state of the sequence's first update
        x = torch.randn(BATCH, TOKENS, block.d_model, requires_grad=True)
        count = Count()
        with count:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                y = block(x, state)[0]
            count.phase = "backward"
            y.backward(torch.ones_like(y))
        params = sum(p.numel() for p in block.parameters())
        flops = block.flops(TOKENS, BATCH, backward=True)
        head = model.flops(TOKENS, BATCH, backward=True) - sum(
            b.flops(TOKENS, BATCH, True) for b in model.blocks
        )
        head_params = sum(p.numel() for p in model.parameters()) - sum(
            p.numel() for b in model.blocks for p in b.parameters()
        )
    return count.rows, params, flops, head, head_params


def main() -> None:
    torch.manual_seed(0)
    gpu_path()
    rows, params, block_flops, head_flops, head_params = count_block()
    gemm = sum(r[3] for r in rows)
    other = sum(r[4] for r in rows if r[3] == 0)
    gemm_bytes = sum(r[4] for r in rows if r[3])
    launches = len(rows)
    print(
        f"one paper GAU, {BATCH} x {TOKENS} tokens, mid-sequence, forward + backward (bf16 autocast, the GPU path):"
    )
    print(f"  {launches} ops ({sum(r[0] == 'forward' for r in rows)} forward), GEMM {gemm / 1e12:.3f} TFLOP "
          f"(their operands and results {gemm_bytes / 2**30:.2f} GiB), other ops {other / 2**30:.2f} GiB; "
          f"the model's count {block_flops / 1e12:.3f} TFLOP; {params / 1e6:.2f}M parameters")  # fmt: skip
    by_place: dict[tuple[str, str], list[float]] = collections.defaultdict(lambda: [0, 0, 0])
    for phase, place, _, flops, size in rows:
        entry = by_place[(phase, place.split(":")[0])]
        entry[0] += 1
        entry[1] += flops
        entry[2] += 0 if flops else size
    print("  by file (phase, ops, GEMM GFLOP, other ops' MiB):")
    for (phase, place), (n, flops, size) in sorted(by_place.items(), key=lambda kv: -kv[1][2]):
        print(f"    {phase:8s} {place:38s} {n:4d} {flops / 1e9:9.1f} {size / 2**20:9.0f}")
    by_op: dict[tuple[str, str, str], list[float]] = collections.defaultdict(lambda: [0, 0])
    for phase, place, name, flops, size in rows:
        if not flops:
            by_op[(phase, place, name)][0] += 1
            by_op[(phase, place, name)][1] += size
    print("  the 25 largest other ops (phase, place, op, count, MiB):")
    for (phase, place, name), (n, size) in sorted(by_op.items(), key=lambda kv: -kv[1][1])[:25]:
        print(f"    {phase:8s} {place:38s} {name.removeprefix('aten::'):28s} {n:3d} {size / 2**20:8.0f}")

    total_params = LAYERS * params + head_params
    model_flops = LAYERS * block_flops + head_flops
    # the head and loss: its GEMMs as counted; its other bytes (the logits in fp32, the softmax, its gradient) a few
    # passes over B·T·V floats; the fused AdamW: fp32 weights, gradients and two moments, 28 bytes a parameter,
    # and the clipping's and finiteness check's reads of the gradients, 8 bytes
    head_bytes = 6 * BATCH * TOKENS * 256 * 4
    step_gemm = LAYERS * gemm + head_flops
    step_other = LAYERS * other + head_bytes + 36 * total_params
    step_launches = LAYERS * launches
    print(f"the step: {total_params / 1e6:.1f}M parameters, the model's count {model_flops / 1e12:.2f} TFLOP, "
          f"GEMMs {step_gemm / 1e12:.2f} TFLOP, other ops {step_other / 2**30:.1f} GiB, {step_launches} ops "
          f"in the blocks (eager)")  # fmt: skip
    t_gemm = step_gemm / (MATMUL * 1e12)
    t_40 = model_flops / (0.4 * PEAK * 1e12)
    print(f"  the GEMMs alone at the measured {MATMUL} TFLOP/s: {1e3 * t_gemm:.1f} ms a step, MFU "
          f"{100 * model_flops / t_gemm / (PEAK * 1e12):.0f}% of the {PEAK} datasheet; 40% is a step of "
          f"{1e3 * t_40:.1f} ms")  # fmt: skip
    for device, bandwidth in BANDWIDTH.items():
        t_mem = step_other / (bandwidth * 1e12)
        budget = (t_40 - t_gemm) * bandwidth * 1e12
        print(f"  {device} ({bandwidth} TB/s): the other ops' eager bytes take {1e3 * t_mem:.1f} ms, so eager the step "
              f"takes at least {1e3 * (t_gemm + t_mem):.1f} ms (MFU {100 * model_flops / (t_gemm + t_mem) / (PEAK * 1e12):.0f}% "
              f"at most); 40% leaves them {budget / 2**30:.0f} GiB a step, {100 * budget / step_other:.0f}% of the eager "
              f"bytes ({budget / LAYERS / 2**30:.2f} GiB a block)")  # fmt: skip
    print(f"  launches: {step_launches} eager ops in the blocks, at 5 µs each {5e-3 * step_launches:.0f} ms of host "
          f"time a step (compiled blocks launch fewer)")  # fmt: skip


if __name__ == "__main__":
    main()
