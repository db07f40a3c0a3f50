"""The bytes each op of the VQ layer reads and writes, forward and backward, at the GPU check's attention shape
(bf16, head dim 128, ``S = L = 512``, 4 heads, ``B·H·T`` = 512k tokens; ``T`` the first argument, 32768 by default;
the heads the second, where one is the GAU's and MQA's layout),
``kernel=triton`` with the GPU's fused code search: counted on fake tensors (no memory, no GPU), each custom op (the
fused kernels) by its arguments and results. What the eager layer moves around its kernels, op by op; each op
outside the custom ops is one or more kernel launches on a GPU.

Run from the repository root: ``TRITON_INTERPRET=1 .venv/bin/python docs/step_analysis/2026-11-28/layer_traffic.py``
(seconds; the interpreter only lets ``kernel=triton`` be built on a CPU: no kernel runs). Since 2026-11-29 an op that
overwrites its first argument (``copy_``, ``fill_``) counts it as written only, not also as read.
"""

from __future__ import annotations

import collections
import sys
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import tvq_exp.quantize.codebook as codebook_module
from tvq_exp.attention import build_attention

HEADS, D, TOKENS = 4, 128, 512 * 1024
OVERWRITE = ("aten::copy_", "aten::fill_", "aten::zero_")  # their first argument is written, not read
FREE = ("aten::detach", "aten::lift_fresh", "aten::_unsafe_view", "prim::device", "aten::new_zeros",
        "aten::new_empty_strided", "aten::new_empty", "aten::zeros", "aten::empty", "aten::arange", "aten::scalar_tensor")  # fmt: skip


def touched(t: torch.Tensor) -> int:
    """The bytes of ``t`` an op must touch: an expanded dimension (stride 0, e.g. an index broadcast over the
    feature dimension) is one element, not its size (until 2026-11-28 each element was counted, which overstated
    the quantiser's gather and scatter by their index's int64 copies)."""
    distinct = 1
    for size, stride in zip(t.shape, t.stride(), strict=True):
        distinct *= size if stride else 1
    return distinct * t.element_size()


class Traffic(TorchDispatchMode):
    """``(op, bytes read, bytes written, first result)`` of every op that moves data (views and allocations left
    out; an allocation's bytes are counted where they are written)."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple[str, int, int, str]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if func.is_view or func._schema.name in FREE:
            return out
        size = lambda xs: sum(touched(t) for t in xs if isinstance(t, torch.Tensor))  # noqa: E731
        results = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        first = f"{str(results[0].dtype).removeprefix('torch.')}{tuple(results[0].shape)}" if results else ""
        read = tree_flatten((args[1:] if func._schema.name in OVERWRITE else args, kwargs))[0]
        self.rows.append((str(func.overloadpacket), size(read), size(results), first))
        return out


def main() -> None:
    seq_len = int(sys.argv[1]) if len(sys.argv) > 1 else 32768
    heads = int(sys.argv[2]) if len(sys.argv) > 2 else HEADS
    batch = max(1, TOKENS // (seq_len * heads))
    # the GPU's search (a CUDA-only custom op: its fake kernel runs on fake CPU tensors), which the quantiser hands
    # bf16 keys as they are since 2026-11-29 (twentieth session)
    codebook_module.nearest_code = lambda x, c: torch.ops.tvq.nearest_code(x.detach(), c.detach())
    codebook_module.fused_search = lambda x: True
    with FakeTensorMode(allow_non_fake_inputs=True):
        layer = build_attention(
            "vq", d_k=D, d_v=D, heads=heads, codebook_size=512, block_len=512, kernel="triton"
        )
        leaves = [
            torch.randn(batch, seq_len, heads, D, dtype=torch.bfloat16).requires_grad_() for _ in range(3)
        ]
        traffic = Traffic()
        with traffic:
            with torch.autocast("cpu", torch.bfloat16):
                out = layer(*(x.transpose(1, 2) for x in leaves))[0]
            forward = len(traffic.rows)
            out.backward(torch.ones_like(out))
    print(f"B={batch} H={heads} T={seq_len} d={D}, bf16: MiB read + written per op")
    for phase, rows in (("forward", traffic.rows[:forward]), ("backward", traffic.rows[forward:])):
        kernels = [r for r in rows if r[0].startswith("tvq.")]
        glue = [r for r in rows if not r[0].startswith("tvq.")]
        mib = lambda rs: sum(r[1] + r[2] for r in rs) / 2**20  # noqa: E731
        print(f"== {phase}: {len(glue)} ops outside the fused kernels, {mib(glue):.0f} MiB; the fused kernels' "
              f"arguments and results {mib(kernels):.0f} MiB")  # fmt: skip
        by_op: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
        for name, read, written, _ in glue:
            by_op[name][0] += 1
            by_op[name][1] += (read + written) / 2**20
        for name, (count, size) in sorted(by_op.items(), key=lambda kv: -kv[1][1])[:12]:
            print(f"  {size:7.0f} MiB  {count:3d}x {name}")
        for name, read, written, first in rows:
            print(f"    {name} {(read + written) / 2**20:.0f} {first}")


if __name__ == "__main__":
    main()
