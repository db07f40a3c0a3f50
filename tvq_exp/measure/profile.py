"""Where a call's or a training step's time goes: torch.profiler's rows summed with each kernel counted once
(:func:`profile_summary`), the host's side of it (:func:`host_summary`), and one profiled call (:func:`profile_calls`). The training step's profile is
:class:`~tvq_exp.callbacks.device_profile.DeviceProfile`; the GPU check and the tile search profile single calls."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from tvq_exp.measure.timing import sync

# the fused Triton kernels of this repository (the window + cache step's, the running means', the code search's, the
# quantiser's pass over its keys) by the names the profiler gives them: their functions'
OUR_KERNELS = (
    "forward_kernel", "dq_kernel", "window_key_kernel", "code_kernel", "block_sums_kernel", "prefix_forward_kernel",
    "prefix_backward_kernel", "code_rows_kernel", "delta_kernel", "nearest_kernel", "pieces_kernel",
    "statistics_kernel", "error_grad_kernel", "metrics_kernel",
)  # fmt: skip
# SDPA's flash, memory-efficient (fmha_cutlass) and cuDNN kernels
ATTENTION_MARKS = ("flash", "fmha", "cudnn")
# cuBLAS(Lt), CUTLASS, inductor's GEMM templates
GEMM_MARKS = ("gemm", "nvjet", "xmma", "cutlass", "triton_tem_")
CPU_GEMMS = ("aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm", "aten::_scaled_mm")


def kernel_kind(name: str) -> str:
    """The kind of a profiler row, by its name: ``attention`` (SDPA's fused kernels), ``fused_vq`` (this repository's
    Triton kernels, and on a CPU its custom ops ``tvq::``), ``gemm`` (cuBLAS, CUTLASS, inductor's GEMM templates, whose
    ``triton_tem_`` prefix its flex-attention templates share; on a CPU the matmul ops), ``inductor`` (its generated pointwise and reduction kernels), ``copies`` (memcpy, memset)
    or ``other`` (ATen's own kernels and ops)."""
    low = name.lower()
    if any(mark in low for mark in ATTENTION_MARKS):
        return "attention"
    if name in OUR_KERNELS or name.startswith("tvq::"):
        return "fused_vq"
    if any(mark in low for mark in GEMM_MARKS) or name in CPU_GEMMS:
        return "gemm"
    if name.startswith("triton_"):
        return "inductor"
    if name.startswith(("Memcpy", "Memset")):
        return "copies"
    return "other"


def profile_summary(
    averages: Any, key: str, steps: int, rows: int, device_events: bool = False, wall_ms: float | None = None
) -> dict[str, Any]:
    """``{"steps", "ms_per_step", "calls_per_step", "rows"}`` of torch.profiler's ``key_averages()`` by the self
    time ``key`` (µs), per step of ``steps``: every op's self time summed (``ms_per_step``), the ``rows`` largest
    with their share. ``device_events``: count only the device's own events (kernels, copies, memsets): not the
    host ops, whose self device time is the time of the kernels they launched, nor the ranges the profiler copies
    onto the device's timeline (``record_function``: inductor's ``## Call CompiledFxGraph ##`` around each compiled
    graph, the optimiser's step), whose time is the span of the kernels inside them. ``wall_ms``: the steps' wall
    clock, which adds ``wall_ms_per_step`` and ``busy_share`` (``ms_per_step`` over it: below 1, the device waited
    for the host). ``by_kind``: ``ms_per_step`` split by :func:`kernel_kind` (the GEMMs' time against the rest's,
    which a step's floor in bytes bounds)."""
    events = [e for e in averages if not device_events or device_work(e)]
    timed = [(event.key, getattr(event, key) / 1e3 / steps, event.count / steps) for event in events]
    timed = sorted((t for t in timed if t[1] > 0), key=lambda t: -t[1])
    total = sum(ms for _, ms, _ in timed)
    by_kind: dict[str, float] = {}
    for name, ms, _ in timed:
        kind = kernel_kind(name)
        by_kind[kind] = by_kind.get(kind, 0.0) + ms
    summary = {
        "steps": steps,
        "ms_per_step": total,
        "by_kind": dict(sorted(by_kind.items(), key=lambda kv: -kv[1])),
        "calls_per_step": sum(calls for _, _, calls in timed),
        "rows": [
            {"name": name, "ms_per_step": ms, "share": ms / total, "calls_per_step": calls}
            for name, ms, calls in timed[:rows]
        ],
    }
    if wall_ms is not None:
        summary["wall_ms_per_step"] = wall_ms / steps
        summary["busy_share"] = total / summary["wall_ms_per_step"]
    return summary


def host_summary(averages: Any, steps: int, rows: int) -> dict[str, Any]:
    """The host's side of a profile: ``{"ms_per_step", "calls_per_step", "rows"}`` of the host's ops (and
    ``record_function`` ranges) by their self CPU time per step of ``steps``, the ``rows`` largest. Where the device
    waits for the host (``busy_share`` well under 1), these name the host's time: the Python and dispatch around the
    launches, each launch's own cost (``cudaLaunchKernel``, Triton's launcher), the ops' bookkeeping."""
    summary = profile_summary(
        averages, "self_cpu_time_total", steps, rows
    )  # the device's events take no CPU time
    return {key: summary[key] for key in ("ms_per_step", "calls_per_step", "rows")}


def device_work(event: Any) -> bool:
    """Whether a profiler row is the device's own work: a device event, not a user annotation's range."""
    return event.device_type != DeviceType.CPU and not getattr(event, "is_user_annotation", False)


def profile_calls(
    fn: Callable[[], object], device: torch.device, calls: int = 1, rows: int = 20
) -> dict[str, Any]:
    """:func:`profile_summary` of ``calls`` calls of ``fn`` (warmed up by the caller; each call counts as a step):
    on CUDA the device's own events by their self device time, elsewhere the ops' self CPU time; its wall clock
    with ``device`` synchronised at both ends, the profiler's overhead included."""
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
    sync(device)
    with profile(activities=activities) as prof:
        started = time.perf_counter()
        for _ in range(calls):
            fn()
        sync(device)
        wall_ms = (time.perf_counter() - started) * 1e3
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    averages = prof.key_averages()
    summary = profile_summary(averages, key, calls, rows, device_events=cuda, wall_ms=wall_ms)
    summary["host"] = host_summary(averages, calls, rows)
    return summary


def compile_summary(top: int = 5) -> dict[str, Any]:
    """What ``torch.compile`` did in this process so far, from dynamo's counters: ``graphs`` (graphs compiled),
    ``frames`` (frames compiled: a frame compiled again after its guards failed, for another TBPTT position say,
    counts again), ``graph_breaks`` and their ``top`` most frequent ``break_reasons`` (each its first line and its
    developer context, as dynamo words them, with its count), and ``resumes``: the functions that continue a frame
    after a break, by name (``torch_dynamo_resume_in_forward_at_257``: a function ``forward`` after its break at
    line 257), each with how often it was compiled. A step that compiles whole has no break and no resume."""
    from torch._dynamo.utils import counters

    reasons: dict[str, int] = {}
    for reason, count in counters["graph_break"].items():
        lines = [line.strip() for line in reason.strip().splitlines() if line.strip()]
        context = [line for line in lines if line.startswith("Developer debug context")]
        key = " | ".join(lines[:1] + context[:1])[:400]
        reasons[key] = reasons.get(key, 0) + count
    return {
        "graphs": counters["stats"]["unique_graphs"],
        "frames": counters["frames"]["total"],
        "graph_breaks": sum(counters["graph_break"].values()),
        "break_reasons": dict(sorted(reasons.items(), key=lambda item: -item[1])[:top]),
        "resumes": dict(counters["resumes"]),
    }


__all__ = [
    "compile_summary",
    "device_work",
    "host_summary",
    "kernel_kind",
    "profile_calls",
    "profile_summary",
]
