"""Inductor's scheduled kernels, recorded without generating their code: after :func:`install`, each graph
``torch.compile`` lowers is scheduled (fused) as inductor schedules it, its kernels are appended to :data:`GRAPHS`,
and the graph then runs as it is (its FX ops, on whatever tensors come: fake ones too). Each kernel has inductor's
own estimate of the bytes it reads and writes (``get_read_write_buffers_sizes``) and the lines of this repository
its ops come from. Used by ``paper_block_compiled.py`` and ``layer_compiled_glue.py``.
"""

from __future__ import annotations

import types
from typing import Any, NamedTuple

import torch
from torch._inductor import graph as graph_module


class Kernel(NamedTuple):
    """One scheduled kernel: its bytes read and written, whether it is an extern call (a GEMM, a custom op, a
    scatter) rather than a kernel inductor generates, the ``file:line`` of ours its ops come from, and an extern
    call's op (``tvq.code_means.default``, ``extern_kernels.bmm``; empty for a generated kernel)."""

    bytes: int
    extern: bool
    lines: tuple[str, ...]
    op: str = ""

    def files(self) -> frozenset[str]:
        return frozenset(line.rsplit(":", 1)[0] for line in self.lines)


GRAPHS: list[list[Kernel]] = []


def lines(node: Any) -> tuple[str, ...]:
    """``file:line`` (under ``tvq_exp/``) of the innermost frame of ours of each FX op a scheduled node fuses."""
    found = set()
    for part in node.get_nodes():
        for origin in getattr(part.node, "origins", ()) or ():
            frames = [f for f in (origin.meta.get("stack_trace") or "").splitlines() if "tvq_exp/" in f]
            if frames:
                where = frames[-1].split("tvq_exp/")[1]
                found.add(f"{where.split(chr(34))[0]}:{where.split('line ')[1].split(',')[0]}")
    return tuple(sorted(found))


def op(node: Any) -> str:
    """An extern call's op (its overload, or the kernel's name); empty for a kernel inductor generates."""
    if type(node).__name__ != "ExternKernelSchedulerNode":
        return ""
    inner = node.node
    return str(getattr(inner, "op_overload", None) or getattr(inner, "python_kernel_name", None) or "")


def _schedule_only(self: graph_module.GraphLowering) -> types.SimpleNamespace:
    """In place of generating code: schedule the graph, record its kernels, and run the graph as it is."""
    from torch._inductor.scheduler import Scheduler

    self.init_wrapper_code()
    self.scheduler = Scheduler(self.operations)
    GRAPHS.append(
        [
            Kernel(
                n.get_read_write_buffers_sizes(),
                type(n).__name__ == "ExternKernelSchedulerNode",
                lines(n),
                op(n),
            )
            for n in self.scheduler.nodes
        ]
    )
    module = self.module

    def call(args: list) -> list:
        out = torch.fx.Interpreter(module).run(*list(args))
        return list(out) if isinstance(out, (tuple, list)) else [out]

    return types.SimpleNamespace(call=call, runner=None)


def install() -> None:
    """Record instead of generating code, from now on; no cache may hand back a graph compiled before."""
    graph_module.GraphLowering.compile_to_module = _schedule_only
    torch._inductor.config.fx_graph_cache = False
    torch._functorch.config.enable_autograd_cache = False
