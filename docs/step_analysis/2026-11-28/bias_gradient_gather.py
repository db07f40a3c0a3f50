"""The plain kernel's XL-bias gradient gathered (fourteenth session) against the same kernel scattering it (162a381,
read with ``git show``): every gradient bit for bit, and the forward + backward time of each, on CPU, fp32.
``OMP_NUM_THREADS=1 .venv/bin/python docs/step_analysis/2026-11-28/bias_gradient_gather.py`` from the repository
root. Shapes: N = 2 sequences, 4 items of L = 512 queries, d_k 64, d_v 128, S = 512 codes; the window two blocks (or
one: a sequence's first block), the XL bias over M distances, with or without a sliding span."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

import torch

from tvq_exp.attention.vq import kernel as gathered

BEFORE = "162a381"


def scattering() -> ModuleType:
    source = subprocess.run(["git", "show", f"{BEFORE}:tvq_exp/attention/vq/kernel.py"], check=True,
                            capture_output=True, text=True).stdout  # fmt: skip
    path = Path(tempfile.mkdtemp()) / "kernel_before.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("kernel_before", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def grad_of(kernel: ModuleType, inputs: tuple, wrt: list[torch.Tensor], g: torch.Tensor) -> tuple:
    """The gradients of ``kernel``'s window + cache attention of ``inputs`` w.r.t. ``wrt``, for the output's ``g``."""
    return torch.autograd.grad(kernel.window_cache_attention(inputs), wrt, g)


def main() -> None:
    torch.manual_seed(0)
    before = scattering()
    n, items, block, dk, dv, codes = 2, 4, 512, 64, 128, 512
    print("window, span, M: gradients; ms per forward + backward (before, after; mean of 3)")
    for one_block, span, m in [(False, None, 512), (True, None, 512), (False, 384, 512), (False, None, 256)]:
        blocks = items + (0 if one_block else 1)
        x = lambda *shape: torch.randn(*shape, requires_grad=True)  # noqa: E731
        q, kb, vb, bq, rel = x(n, items, block, dk), x(n, blocks, block, dk), x(n, blocks, block, dv), \
            x(n, items, block, dk), x(n, 1, m + 1, dk)  # fmt: skip
        counts = torch.randint(0, 3, (n, items, codes)).float()
        codebook, log_n = torch.randn(n, codes, dk), torch.where(counts > 0, counts.log(), float("-inf"))
        mu, g = x(n, items, codes, dv), torch.randn(n, items, block, dv)
        results = []
        for kernel in (before, gathered):
            index = kernel.WindowIndex.of_block(block, 0, block, one_block, m, span)
            inputs = kernel.WindowInputs(q, kb, vb, index, kernel.WindowBias(bq, rel),
                                         kernel.CodeCache(codebook, log_n, mu), prev_masked=not one_block)  # fmt: skip
            wrt = [q, kb, vb, bq, rel, mu]
            grads = grad_of(kernel, inputs, wrt, g)
            start = time.perf_counter()
            for _ in range(3):
                grad_of(kernel, inputs, wrt, g)
            results.append((grads, (time.perf_counter() - start) / 3 * 1e3))
        same = all(torch.equal(a, b) for a, b in zip(results[0][0], results[1][0], strict=True))
        window = "one block" if one_block else "two blocks"
        print(f"{window}, span {span}, M {m}: {'bit for bit equal' if same else 'DIFFERENT'}; "
              f"{results[0][1]:.0f}, {results[1][1]:.0f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
