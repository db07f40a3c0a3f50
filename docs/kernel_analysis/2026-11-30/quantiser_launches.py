"""The VQ layer's eager forward + backward as the GPU check's ``vq_triton`` case runs it (bf16 under autocast, keys laid
out (B, T, H, d), the search and the quantiser's pass fused as on CUDA), counted on CPU under Triton's interpreter: the
ATen ops a dispatch mode sees (each a launch on a GPU, allocations included), the key-sized ones, and the Triton
kernels. Run from a checkout's root: ``TRITON_INTERPRET=1 .venv/bin/python docs/kernel_analysis/2026-11-30/quantiser_launches.py``
(at a commit before the fused pass, the same script counts the plain quantiser; its last line, the forward's ATen
launches in order, is new since the thirty-third session)."""

import collections
import importlib
import os
import sys

sys.path.insert(0, os.getcwd())
import torch  # noqa: E402
import triton.runtime.interpreter as interpreter  # noqa: E402
from torch.utils._python_dispatch import _disable_current_modes  # noqa: E402

from tests.helpers.ops import OpLog  # noqa: E402
from tvq_exp.attention import build_attention  # noqa: E402

for name in ("tvq_exp.quantize.kmeans", "tvq_exp.quantize.codebook"):  # as on CUDA with Triton
    importlib.import_module(name).fused_search = lambda x: True
kernels: list[str] = []
run = interpreter.InterpretedFunction.run


def record(self: interpreter.InterpretedFunction, *args: object, **kwargs: object) -> object:
    kernels.append(self.__name__)
    with _disable_current_modes():  # the interpreter's own copies not counted
        return run(self, *args, **kwargs)


interpreter.InterpretedFunction.run = record
torch.manual_seed(0)
B, H, T, d = 1, 4, 256, 16
layer = build_attention("vq", d_k=d, d_v=d, heads=H, codebook_size=64, block_len=64, kernel="triton")
gen = torch.Generator().manual_seed(0)
leaves = [
    (torch.randn(B, T, H, d, generator=gen) * d**-0.25).bfloat16().requires_grad_(True) for _ in range(3)
]
q, k, v = (x.transpose(1, 2) for x in leaves)
grad = torch.randn(B, T, H, d, generator=gen).bfloat16().transpose(1, 2)
for _ in range(2):  # the second call counted (the first initialises)
    for leaf in leaves:
        leaf.grad = None
    kernels.clear()
    log = OpLog()
    with log, torch.autocast("cpu", torch.bfloat16):
        out = layer(q, k, v)[0]
    forward, forward_kernels, forward_ops = len(log.launches()), len(kernels), [op.name for op in log.launches()]
    with log:
        out.backward(grad)
launches = log.launches()
big = collections.Counter(op.name for op in launches if op.numel >= k.numel())
print(f"forward: {forward} ATen launches, {forward_kernels} Triton kernels {kernels[:forward_kernels]}")
print(f"forward + backward: {len(launches)} ATen launches, {len(kernels)} Triton kernels")
print(f"key-sized ATen results: {dict(big)}")
print(f"the forward's ATen launches in order: {' '.join(name.removeprefix('aten.') for name in forward_ops)}")
print(
    f"output sum {out.float().sum().item():.6f}, keys' gradient sum {leaves[1].grad.float().sum().item():.6f}"
)
