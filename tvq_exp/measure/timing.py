"""Timing: synchronised wall-clock timing of calls and this device's matmul rate (the FLOP-utilisation reference)."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from tvq_exp.measure.syncs import waited


def sync(device: torch.device) -> None:
    """Wait for ``device``'s queued work (CUDA); nothing to wait for on a CPU (a count of the host's reads records
    it either way: :func:`~tvq_exp.measure.syncs.waited`)."""
    waited()
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_calls(fn: Callable[[], None], device: torch.device, reps: int, budget_s: float) -> list[float]:
    """One warm-up call, then ``min(reps, budget_s / t)`` (at least 1) timed calls, in ms, where ``t`` is the first
    timed call's time. The count comes from a call after the warm-up: a first call that compiles or loads kernels
    (seconds) would otherwise leave one timed call, itself still slow where the second call is."""
    fn()
    sync(device)
    times: list[float] = []
    while len(times) < reps:
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
        if len(times) >= budget_s / max(times[0] / 1e3, 1e-9):
            break
    return times


def matmul_peak_flops(
    device: torch.device, dtype: torch.dtype, size: int | None = None, reps: int = 5
) -> float:
    """Measured matmul FLOP/s of ``device`` in ``dtype``: the fastest of ``reps`` square ``(n, n) @ (n, n)``
    products after one warm-up (``n`` 8192 on CUDA, 1024 elsewhere: ~0.2 s on one CPU core). On CUDA
    the peak-memory statistics are reset afterwards, so the benchmark's matrices do not count."""
    n = size or (8192 if device.type == "cuda" else 1024)
    gen = torch.Generator(device=device).manual_seed(
        0
    )  # its own generator: the run's RNG streams stay untouched
    a, b = (torch.randn(n, n, device=device, dtype=dtype, generator=gen) for _ in range(2))
    best = float("inf")
    for _ in range(reps + 1):
        start = time.perf_counter()
        torch.mm(a, b)
        sync(device)
        best = min(best, time.perf_counter() - start)
    del a, b
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    return 2 * n**3 / best
