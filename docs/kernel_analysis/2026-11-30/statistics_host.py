"""The host's time of the quantiser's per-key work, fused (:func:`tvq_exp.quantize.fused_statistics.code_statistics`,
its kernels' launches recorded and not run) against torch's ops (``plain_statistics``) at a size where the ops' own
work is small (2 heads of 8 keys of 8, 4 codes, one thread): what each path costs the host before the device runs
anything. Run from a checkout's root: ``.venv/bin/python docs/kernel_analysis/2026-11-30/statistics_host.py``."""

import time

import torch
import triton.runtime.interpreter as interpreter

from tvq_exp.quantize.fused_statistics import code_statistics, plain_statistics

torch.set_num_threads(1)
interpreter.InterpretedFunction.run = lambda self, *a, **k: None  # the launch not run
k = torch.randn(1, 8, 2, 8).transpose(1, 2).requires_grad_(True)
codebook, codes = torch.randn(2, 4, 8), torch.randint(0, 4, (2, 8))


def microseconds(call: object, n: int = 3000) -> float:
    for _ in range(100):
        call()
    start = time.perf_counter()
    for _ in range(n):
        call()
    return (time.perf_counter() - start) / n * 1e6


for name, fn in (("fused", code_statistics), ("plain", plain_statistics)):
    forward = microseconds(lambda fn=fn: fn(k, codes, codebook, True))
    both = microseconds(lambda fn=fn: fn(k, codes, codebook, True).sq_error.backward())
    print(f"{name}: forward {forward:.0f} us, forward + backward {both:.0f} us")
