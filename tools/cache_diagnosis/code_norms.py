"""``python tools/cache_diagnosis/code_norms.py RUN_DIR [RUN_DIR ...]``: the norm of the code vectors that a trained
Transformer-VQ's scores read, per VQ layer, against the norm of the keys they stand for.

A score in the window or the cache is ``q · C_s``, so the codes' norm sets the attention's temperature as the
keys' norm does in a dense model. For each run folder (its ``checkpoints/last.ckpt``, read by the safe loader and
rebuilt from its stored run: :func:`tvq_exp.run.build.load_checkpoint`) prints
one line per VQ layer: the mean norm of the codes weighted by their usage counts ``ema_count`` (what the keys in
use see) and the norm of a key as the search sees it (``d_k^1/4`` for GAU's RMS-normalised keys, 1 for unit keys
or under ``codebook.normalize``).
"""

from __future__ import annotations

import sys
from pathlib import Path

from torch import nn

from tvq_exp.attention.vq.layer import VQAttention
from tvq_exp.run.build import load_checkpoint


def code_norms(model: nn.Module) -> list[float]:
    """Per VQ layer, in build order: ``Σ_hs n_hs·||C_hs|| / Σ_hs n_hs`` over heads and codes (``n = ema_count``)."""
    norms = []
    for layer in (m for m in model.modules() if isinstance(m, VQAttention)):
        weight = layer.quantizer.ema_count.float()
        norms.append(float((layer.codebook.detach().float().norm(dim=-1) * weight).sum() / weight.sum()))
    return norms


def key_norm(config: dict) -> float:
    """The norm of a key as the nearest-code search sees it (GAU blocks)."""
    block, codebook = config["model"]["block"], config["model"]["attention"].get("codebook") or {}
    if block.get("key_norm") == "unit" or codebook.get("normalize"):
        return 1.0
    return float(block["d_k"]) ** 0.25


def trained_model(run: Path) -> tuple[nn.Module, dict]:
    """The run's decoder with the weights of ``checkpoints/last.ckpt``, and its stored run (model, data, module)."""
    module, config, _ = load_checkpoint(run / "checkpoints" / "last.ckpt")
    return module.model, config


def main(runs: list[str]) -> None:
    for run in map(Path, runs):
        model, config = trained_model(run)
        norms = " / ".join(f"{n:.3f}" for n in code_norms(model))
        print(f"{run.name}: code norms by layer {norms}; key norm {key_norm(config):.3f}")


if __name__ == "__main__":
    main(sys.argv[1:])
