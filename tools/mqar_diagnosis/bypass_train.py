"""``python tools/mqar_diagnosis/bypass_train.py [train.py overrides]``: ``train.py`` with the key quantiser of
the blocks listed in ``$TVQ_BYPASS`` (comma-separated block indices, e.g. ``1`` or ``0,1``) bypassed.

A bypassed layer attends over its raw keys ``k`` instead of ``k_hat``; its quantiser still runs (codebook
statistics, metrics, codes). With ``block_len >= seq_len / 2`` no block reads the cache, so a bypassed layer is
exactly dense attention with the XL bias window ``M = block_len`` (docs/mqar_diagnosis.md). A diagnostic, not a
model option: it patches :class:`~tvq_exp.quantize.codebook.VectorQuantizer` in this process only.
"""

from __future__ import annotations

import functools
import os
import runpy
import sys
from pathlib import Path

from torch import Tensor

from tvq_exp.quantize.codebook import VectorQuantizer

BYPASS = {int(x) for x in os.environ.get("TVQ_BYPASS", "").split(",") if x}
_built = [0]  # quantisers built so far: block i's is the i-th of each model (one per block)
_init, _forward = VectorQuantizer.__init__, VectorQuantizer.forward


@functools.wraps(_init)  # keeps the signature: the config validation reads the options from it
def _numbered_init(self: VectorQuantizer, *args: object, **kwargs: object) -> None:
    _init(self, *args, **kwargs)
    self.block_index = _built[0] % int(os.environ.get("TVQ_LAYERS", "2"))
    _built[0] += 1


@functools.wraps(_forward)
def _bypassed_forward(self: VectorQuantizer, k: Tensor) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
    k_hat, codes, aux = _forward(self, k)
    return (k if self.block_index in BYPASS else k_hat), codes, aux


if __name__ == "__main__":
    VectorQuantizer.__init__, VectorQuantizer.forward = _numbered_init, _bypassed_forward
    root = Path(__file__).resolve().parents[2]
    sys.argv = [str(root / "train.py"), *sys.argv[1:]]
    runpy.run_path(str(root / "train.py"), run_name="__main__")
