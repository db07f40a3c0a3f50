"""Memory: peak accelerator memory or resident set size, its growth over a measured call, address-space caps."""

from __future__ import annotations

import resource
from pathlib import Path

import torch


def peak_memory_mb(device: torch.device) -> float:
    """Peak accelerator memory allocated (CUDA) or the process's peak resident set size (CPU), in MiB."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _read_status_kb(field: str) -> int:
    """A ``VmRSS`` / ``VmHWM`` field of ``/proc/self/status`` in kB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


class PeakMemory:
    """Peak memory growth from :meth:`start` to :meth:`peak_mb` (RSS high-water mark or CUDA)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.base = 0

    def start(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = torch.cuda.memory_allocated(self.device)
            return
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
        self.base = _read_status_kb("VmRSS") * 1024

    def peak_mb(self) -> float:
        if self.device.type == "cuda":
            return (torch.cuda.max_memory_allocated(self.device) - self.base) / 2**20
        return (_read_status_kb("VmHWM") * 1024 - self.base) / 2**20


def limit_address_space(extra_mb: float) -> None:
    """Let this process map at most ``extra_mb`` MiB beyond what it maps now (``RLIMIT_AS``): larger
    allocations then fail (and are reported as out of memory) instead of exhausting the machine."""
    now = _read_status_kb("VmSize") * 1024
    resource.setrlimit(
        resource.RLIMIT_AS, (now + int(extra_mb * 2**20), resource.getrlimit(resource.RLIMIT_AS)[1])
    )
