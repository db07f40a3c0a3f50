"""The host's time of one training forward of the quantiser as a CUDA step runs it eagerly (the search fused, the
fused pass after it), its Triton launches recorded and not run: the codebook's search pieces, the search itself
(its codes fixed: a run not run leaves none), the pass over the keys, the losses and metrics, the EMA sums. Small
tensors (4 heads of 64 keys of 16, 64 codes, one thread), so that torch's own work on the CPU is small: what the
forward costs the host before the device runs anything, a bound on a GPU (where each ATen op is a launch of some
microseconds, and a Triton launch another). Run from a checkout's root, at this commit and at one before it:
``.venv/bin/python docs/kernel_analysis/2026-11-30-second/quantiser_host.py``."""

import importlib
import os
import sys

sys.path.insert(0, os.getcwd())
import torch  # noqa: E402
import triton.runtime.interpreter as interpreter  # noqa: E402

from tvq_exp.quantize.codebook import VectorQuantizer  # noqa: E402
from tvq_exp.measure.timing import time_calls  # noqa: E402
from tvq_exp.quantize.fused_nearest import search_codes  # noqa: E402

torch.set_num_threads(1)
interpreter.InterpretedFunction.run = lambda self, *a, **k: None  # the launch not run
codebook_module = importlib.import_module("tvq_exp.quantize.codebook")
codebook_module.fused_search = lambda x: True  # as on CUDA with Triton
codes = torch.randint(0, 64, (4, 64), generator=torch.Generator().manual_seed(0))
codebook_module.nearest_code = lambda x, c: (search_codes(c.detach(), x.dtype), codes)[1]
torch.manual_seed(0)
vq = VectorQuantizer(4, 64, 16)
k = torch.randn(1, 64, 4, 16).bfloat16().transpose(1, 2).requires_grad_(True)
vq(k)  # the k-means initialisation


times = sorted(time_calls(lambda: vq(k), torch.device("cpu"), reps=20000, budget_s=6.0))
print(f"the quantiser's training forward: median {1e3 * times[len(times) // 2]:.0f} us of the host's time, "
      f"fastest {1e3 * times[0]:.0f} us ({len(times)} calls)")  # fmt: skip
