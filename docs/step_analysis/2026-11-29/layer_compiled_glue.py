"""The bytes the compiled VQ attention layer moves around its fused kernels, at the GPU check's attention case (bf16,
head dim 128, ``S = L = 512``, 4 heads, ``B·H·T`` = 512k tokens, T = 32k, ``kernel=triton``, the GPU's fused code
search; ``(B, T, H, d)`` operands as the check draws them), forward and backward: ``torch.compile`` of the layer,
each kernel inductor schedules with its own byte estimate (``get_read_write_buffers_sizes``) and the lines of ours
its ops come from. The fused kernels and the code search are custom ops (extern calls, counted by their arguments
and results); the glue is what inductor fuses around them. Nothing runs: the inputs are fake tensors, each graph is
scheduled and then interpreted on them.

``layer_traffic.py`` (2026-11-28) counts the same layer eager, op by op. This is the compiled layer that the check's
``vq_triton_compiled`` times. A CPU stand-in: inductor's CPU backend schedules the glue (its fusion rules are mostly
the GPU's, not all).

Run from the repository root: ``TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 TRITON_INTERPRET=1 .venv/bin/python
docs/step_analysis/2026-11-29/layer_compiled_glue.py`` (a minute; the interpreter only lets ``kernel=triton`` be
built on a CPU).
"""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

import torch
from torch._inductor import graph as graph_module
from torch._subclasses.fake_tensor import FakeTensorMode

sys.path.insert(0, str(Path.cwd()))

import tvq_exp.quantize.codebook as codebook_module  # noqa: E402
from tvq_exp.attention import build_attention  # noqa: E402

HEADS, D, TOKENS, T = 4, 128, 512 * 1024, 32768
GRAPHS: list[
    list[tuple[int, bool, list[str]]]
] = []  # per graph: (bytes, an extern call, our lines) per kernel


def lines(node: Any) -> list[str]:
    """``file:line`` of ours that made a scheduled kernel's ops (their FX nodes' stack traces)."""
    found = set()
    for part in node.get_nodes():
        for origin in getattr(part.node, "origins", ()) or ():
            frames = [f for f in (origin.meta.get("stack_trace") or "").splitlines() if "tvq_exp/" in f]
            if frames:
                where = frames[-1].split("tvq_exp/")[1]
                found.add(f"{where.split(chr(34))[0]}:{where.split('line ')[1].split(',')[0]}")
    return sorted(found)


def schedule_only(self: graph_module.GraphLowering) -> types.SimpleNamespace:
    """In place of generating code: schedule the graph, record its kernels, and run the graph as it is."""
    from torch._inductor.scheduler import Scheduler

    self.init_wrapper_code()
    self.scheduler = Scheduler(self.operations)
    GRAPHS.append(
        [
            (n.get_read_write_buffers_sizes(), type(n).__name__ == "ExternKernelSchedulerNode", lines(n))
            for n in self.scheduler.nodes
        ]
    )
    module = self.module

    def call(args: list) -> list:
        out = torch.fx.Interpreter(module).run(*list(args))
        return list(out) if isinstance(out, (tuple, list)) else [out]

    return types.SimpleNamespace(call=call, runner=None)


def main() -> None:
    graph_module.GraphLowering.compile_to_module = schedule_only
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
    for phase, kernels in zip(("forward", "backward"), GRAPHS, strict=True):
        extern = sum(size for size, is_extern, _ in kernels if is_extern)
        glue = sum(size for size, is_extern, _ in kernels if not is_extern)
        print(f"== {phase}: {len(kernels)} kernels; the fused glue {glue / 2**20:.0f} MiB, the extern calls (the fused "
              f"ops, the code search, scatters) {extern / 2**20:.0f} MiB")  # fmt: skip
        for size, is_extern, where in kernels:
            if size >= 2**20:
                kind = "extern" if is_extern else "fused "
                print(f"  {size / 2**20:6.0f} {kind} {' '.join(where)}")


if __name__ == "__main__":
    main()
