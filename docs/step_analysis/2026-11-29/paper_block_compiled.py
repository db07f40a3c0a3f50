"""What inductor fuses of one paper GAU, forward + backward, compiled as ``compile_scope=blocks`` compiles it: the
bytes each of its scheduled kernels reads and writes (inductor's own estimate; ``scheduled.py``: scheduled as
inductor schedules them, their code not generated, the graphs run as they are),
summed by the source files their ops come from. One sequence of a 2048-token update in the middle of a TBPTT
sequence (a carried state), CPU autocast bf16, real tensors.

A CPU stand-in for the GPU's compiled block, with two differences: inductor's CPU backend (its fusion rules are
mostly the GPU's, not all); and the plain kernel's products (a GPU's cuBLAS reads bf16 operands as they are and
writes fp32), counted two ways that bracket the GPU's: ``widened`` as a CPU compiles them (fp32 copies of the
operands, an fp32 product) and ``bf16`` (the operands as they are, a bf16 product). The cache's running means are
the fused op a GPU runs (``tvq::code_means`` and its backward: extern calls, counted by their arguments and results;
their kernels are not launched here, the count needs only shapes). The plain kernel's chunks are the GPU's (every
item at once), not the CPU's cache-sized ones.

Then, with ``paper_roofline.py``'s count of the step's GEMMs, the step's floor on each device: the GEMMs at the
measured matmul rate, and the bytes of the fused kernels and the means ops (times 8 sequences and 48 blocks) at the
memory bandwidth, each at its bound, one after the other.

Run from the repository root: ``TRITON_INTERPRET=1 .venv/bin/python docs/step_analysis/2026-11-29/paper_block_compiled.py``
(under a minute; the interpreter is for ``paper_roofline.py``'s count).
"""

from __future__ import annotations

import collections
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path.cwd()))
os.environ.setdefault("TVQ_DATA_DIR", str(Path.cwd().parent / "shared" / "datasets"))

from hydra.utils import instantiate  # noqa: E402

import tvq_exp.attention.vq.fused.prefix as prefix_module  # noqa: E402
import tvq_exp.attention.vq.kernel as kernel_module  # noqa: E402
import tvq_exp.attention.vq.layer as layer_module  # noqa: E402
from tests.helpers.config import compose_config  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
import paper_roofline as roofline  # noqa: E402
import scheduled  # noqa: E402

TOKENS = 2048


def bf16_products(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, add: bool = False) -> None:
    """The plain kernel's products of bf16 operands in bf16 (read as they are, written in bf16, then widened into
    ``out``): the GPU's cuBLAS reads them as they are too, but writes fp32."""
    if a.dtype != out.dtype and a.dtype == b.dtype:
        prod = a @ b
        out.add_(prod) if add else out.copy_(prod)
    else:
        WIDENED(a, b, out, add)


WIDENED = kernel_module._matmul
LAUNCHED = prefix_module.prefix_kernels


class _Unlaunched:
    """The fused means' kernels (:func:`prefix_module.prefix_kernels`), not launched: their results stay unwritten
    (the count needs shapes alone; interpreted at this size they would take many minutes)."""

    def __init__(self, interpret: bool) -> None:
        self.tl = LAUNCHED(interpret).tl
        self.block_sums_kernel = self.prefix_forward_kernel = self
        self.prefix_backward_kernel = self.code_rows_kernel = self

    def __getitem__(self, grid: tuple) -> object:
        return lambda *args, **kwargs: None


def count(products: str) -> int:
    """Compile one block with the plain kernel's ``products`` (``widened``: the CPU's fp32 copies of bf16 operands;
    ``bf16``: :func:`bf16_products`) and print its kernels' bytes; returns the bytes of the fused kernels and the
    means ops (what runs at the memory's bandwidth)."""
    scheduled.GRAPHS.clear()
    torch._dynamo.reset()
    kernel_module._matmul = bf16_products if products == "bf16" else WIDENED
    torch.manual_seed(0)
    block = instantiate(compose_config("train", roofline.PAPER_BLOCK).model).train().blocks[1]
    x0 = torch.randn(1, TOKENS, block.d_model)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        state = block(x0, None)[1]  # the carried state of the sequence's first update
    block.compile(dynamic=False)
    x = torch.randn(1, TOKENS, block.d_model, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = block(x, state)[0]
    y.backward(torch.ones_like(y))
    kernels = [k for graph in scheduled.GRAPHS for k in graph]
    means = sum(k.bytes for k in kernels if k.op.startswith("tvq."))
    extern = sum(k.bytes for k in kernels if k.extern) - means
    other = sum(k.bytes for k in kernels if not k.extern)
    print(f"== the products {products}: one paper GAU compiled, 1 x {TOKENS} tokens, forward + backward: {len(kernels)} "
          f"scheduled kernels; the extern calls: the GEMMs {extern / 2**30:.3f} GiB, the means ops "
          f"{means / 2**30:.3f} GiB; the fused kernels {other / 2**30:.3f} GiB")  # fmt: skip
    by_files: collections.Counter = collections.Counter()
    for k in kernels:
        if not k.extern:
            by_files[" + ".join(sorted(k.files())) or "(no file of ours)"] += k.bytes
    print("the fused kernels' bytes by the files of their ops (MiB):")
    for where, size in by_files.most_common():
        if size >= 2**20:
            print(f"  {size / 2**20:7.1f}  {where}")
    return other + means


def main() -> None:
    scheduled.install()
    kernel_module.CHUNK_BYTES["cpu"] = kernel_module.CHUNK_BYTES["cuda"]
    layer_module.VQAttention.means_kernel = lambda self, values: "triton"  # the GPU's fused means
    prefix_module.prefix_kernels = _Unlaunched
    per_sequence = {products: count(products) for products in ("widened", "bf16")}
    floors(per_sequence)


def floors(per_sequence: dict[str, int]) -> None:
    """The step's floor on each device with ``per_sequence`` bytes of fused kernels per block and sequence (for
    each form of the products)."""
    roofline.gpu_path()  # its chunks are the GPU's already
    rows, _, block_flops, head_flops, _ = roofline.count_block()
    gemm = roofline.LAYERS * sum(r[3] for r in rows) + head_flops
    model = roofline.LAYERS * block_flops + head_flops
    t_gemm = gemm / (roofline.MATMUL * 1e12)
    print(f"the step ({roofline.BATCH} x {TOKENS} tokens, {roofline.LAYERS} blocks): the GEMMs at {roofline.MATMUL} "
          f"TFLOP/s {1e3 * t_gemm:.1f} ms")  # fmt: skip
    for products, size in per_sequence.items():
        step = roofline.LAYERS * roofline.BATCH * size
        print(f"  the products {products}: the fused kernels' and the means ops' bytes {step / 2**30:.0f} GiB "
              f"({roofline.BATCH * size / 2**30:.2f} GiB a block)")  # fmt: skip
        for device, bandwidth in roofline.BANDWIDTH.items():
            t_mem = step / (bandwidth * 1e12)
            mfu = model / (t_gemm + t_mem) / (roofline.PEAK * 1e12)
            print(f"    {device}: those bytes {1e3 * t_mem:.1f} ms, the step at least "
                  f"{1e3 * (t_gemm + t_mem):.1f} ms: MFU {100 * mfu:.0f}% of the {roofline.PEAK} datasheet at most")  # fmt: skip


if __name__ == "__main__":
    main()
