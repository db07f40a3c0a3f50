"""The bytes the compiled VQ attention layer moves around its fused kernels, at the GPU check's attention case (bf16,
head dim 128, ``S = L = 512``, 4 heads, ``B·H·T`` = 512k tokens, T = 32k, ``kernel=triton``, the GPU's fused code
search; ``(B, T, H, d)`` operands as the check draws them), forward and backward: ``torch.compile`` of the layer,
each kernel inductor schedules with its own byte estimate and the lines of ours its ops come from
(``scheduled.py``). The fused kernels and the code search are custom ops (extern calls, counted by their arguments
and results); the glue is what inductor fuses around them. Nothing runs: the inputs are fake tensors.

``layer_traffic.py`` (2026-11-28) counts the same layer eager, op by op. This is the compiled layer that the check's
``vq_triton_compiled`` times. A CPU stand-in: inductor's CPU backend schedules the glue (its fusion rules are mostly
the GPU's, not all).

Run from the repository root: ``TRITON_INTERPRET=1 .venv/bin/python docs/step_analysis/2026-11-29/layer_compiled_glue.py``
(seconds; the interpreter only lets ``kernel=triton`` be built on a CPU).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

sys.path.insert(0, str(Path.cwd()))
sys.path.insert(0, str(Path(__file__).parent))

import scheduled  # noqa: E402

import tvq_exp.quantize.codebook as codebook_module  # noqa: E402
from tvq_exp.attention import build_attention  # noqa: E402

HEADS, D, TOKENS, T = 4, 128, 512 * 1024, 32768


def main() -> None:
    scheduled.install()
    # the GPU's search (a CUDA-only custom op: its fake kernel runs on fake CPU tensors), handed bf16 keys as they are
    codebook_module.nearest_code = lambda x, c: torch.ops.tvq.nearest_code(x.detach(), c.detach())
    codebook_module.fused_search = lambda x: True
    batch = TOKENS // (T * HEADS)
    with FakeTensorMode(allow_non_fake_inputs=True):
        layer = build_attention(
            "vq", d_k=D, d_v=D, heads=HEADS, codebook_size=512, block_len=512, kernel="triton"
        )
        leaves = [torch.randn(batch, T, HEADS, D, dtype=torch.bfloat16).requires_grad_() for _ in range(3)]
        compiled = torch.compile(lambda q, k, v: layer(q, k, v)[0], dynamic=False)
        out = compiled(*(x.transpose(1, 2) for x in leaves))
        out.backward(torch.ones_like(out))
    print(f"B={batch} H={HEADS} T={T} d={D}, bf16, compiled: MiB read + written per scheduled kernel")
    for phase, kernels in zip(("forward", "backward"), scheduled.GRAPHS, strict=True):
        extern = sum(k.bytes for k in kernels if k.extern)
        glue = sum(k.bytes for k in kernels if not k.extern)
        print(f"== {phase}: {len(kernels)} kernels; the fused glue {glue / 2**20:.0f} MiB, the extern calls (the fused "
              f"ops, the code search, scatters) {extern / 2**20:.0f} MiB")  # fmt: skip
        for k in kernels:
            if k.bytes >= 2**20:
                print(f"  {k.bytes / 2**20:6.0f} {'extern' if k.extern else 'fused '} {' '.join(k.lines)}")


if __name__ == "__main__":
    main()
