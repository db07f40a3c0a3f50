"""What one paper GAU keeps for its backward, per token: ``experiment=enwik8_paper``'s block (d_model 768, d_k 128,
d_v 1536, S = L = 512, XL bias, cache, dropout and LayerDrop) on one 2048-token update, eager, under CPU autocast
in bf16 (what bf16-mixed keeps on a GPU, but for the plain kernel's products: on a CPU it widens their bf16 operands
to fp32, where a GPU's cuBLAS takes them as they are). Each saved tensor is counted once, by its storage.

Run from the repository root: ``.venv/bin/python docs/step_analysis/2026-11-28/saved_bytes.py`` (seconds).
"""

from __future__ import annotations

import collections
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path.cwd()))
os.environ.setdefault("TVQ_DATA_DIR", str(Path.cwd().parent / "shared" / "datasets"))

from hydra.utils import instantiate  # noqa: E402

from tests.helpers.config import compose_config  # noqa: E402

TOKENS = 2048


def main() -> None:
    torch.manual_seed(0)
    overrides = [
        "experiment=enwik8_paper",
        "trainer=cpu",
        "global_batch_size=null",
        "model.n_layers=2",
        "data=kjv",
    ]
    block = instantiate(compose_config("train", overrides).model).blocks[1].train()
    by_shape: collections.Counter = collections.Counter()
    storages: set[int] = set()

    def keep(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in storages:
            storages.add(storage.data_ptr())
            by_shape[(tuple(t.shape), str(t.dtype).removeprefix("torch."))] += storage.nbytes()
        return t

    x = torch.randn(1, TOKENS, block.d_model, requires_grad=True)
    with (
        torch.autocast("cpu", dtype=torch.bfloat16),
        torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t),
    ):
        block(x, None)
    total = sum(by_shape.values())
    print(
        f"one GAU keeps {total / 2**20:.1f} MiB for {TOKENS} tokens: {total / TOKENS / 1024:.1f} KiB per token"
    )
    for (shape, dtype), size in by_shape.most_common(12):
        print(f"{size / 2**20:8.2f} MiB  {dtype:9s} {shape}")


if __name__ == "__main__":
    main()
