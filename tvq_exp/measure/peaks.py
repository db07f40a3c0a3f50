"""Datasheet peaks: the dense bf16 tensor-core FLOP/s each accelerator's vendor states, the reference of MFU as
the field quotes it (model FLOPs per second over this number, e.g. PaLM, Megatron-LM, nanoGPT).

Dense figures (the datasheets also quote 2× "with sparsity"): NVIDIA H100 SXM 989 TFLOP/s, H100 PCIe 756, H100 NVL
835, H200 (SXM) 989, H200 NVL 835, A100 (SXM and PCIe) 312, L40S 362, L4 121, A10 125. A device found in no row
(a CPU, another GPU) has no datasheet peak: its MFU is left out rather than guessed.
"""

from __future__ import annotations

import torch

# (substring of torch.cuda.get_device_name, TFLOP/s); the first match wins, so the narrower names come first
BF16_DENSE_TFLOPS: tuple[tuple[str, float], ...] = (
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("H100", 989.0),
    ("H200 NVL", 835.0),
    ("H200", 989.0),
    ("A100", 312.0),
    ("L40S", 362.0),
    ("L4", 121.0),
    ("A10", 125.0),
)


def datasheet_peak_flops(name: str) -> float | None:
    """The dense bf16 peak FLOP/s of the device called ``name`` (``torch.cuda.get_device_name``), None if unknown."""
    return next((tflops * 1e12 for key, tflops in BF16_DENSE_TFLOPS if key in name), None)


def device_peak_flops(device: torch.device) -> float | None:
    """:func:`datasheet_peak_flops` of ``device`` (None for a CPU)."""
    if device.type != "cuda":
        return None
    return datasheet_peak_flops(torch.cuda.get_device_name(device))


__all__ = ["BF16_DENSE_TFLOPS", "datasheet_peak_flops", "device_peak_flops"]
