"""``python -m tools.mqar_diagnosis.key_clusters CHECKPOINT [overrides]``: how many clusters the attention keys of a
trained recall_cpu model form, per layer: the usage perplexity of a fresh k-means with S codes on held-out keys (the
health metrics' k-means reference, :func:`tvq_exp.quantize.health.codebook_regret`), and, for a VQ model, that of
its own codebook on the same keys; with each, the share of the keys' variance the codes leave unexplained (how
much the keys carry beyond S clusters). Works for any backend whose attention takes ``(q, k, v)`` (dense: pass
``model=gau_dense``), so a VQ model's keys can be set against those of a dense model that solves the task
(docs/codebooks.md)."""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch
from torch import Tensor, nn

from tools.mqar_diagnosis.common import recall_model
from tvq_exp.quantize.health import REGRET_ITERS, assigned_counts, squared_error, usage_perplexity
from tvq_exp.quantize.kmeans import kmeans

BATCHES = 24  # of 64 sequences: 196k key positions per layer, from training-sampler indices never trained on
SAMPLE = 8192  # keys per layer given to k-means (as the health callback)
CODES = 64  # S of recall_cpu


def unexplained(keys: Tensor, codebook: Tensor) -> float:
    """The share of the keys' variance (about each head's mean key) that ``codebook`` leaves unexplained:
    ``Σ ||k - c(k)||² / Σ ||k - mean||²``, 0 (the codes name every key) to 1 (they carry nothing)."""
    centred = (keys - keys.mean(1, keepdim=True)).pow(2).sum()
    return float(squared_error(keys, codebook).sum() / centred)


def usage(keys: Tensor, codebook: Tensor) -> float:
    """Usage perplexity (mean over heads) of ``codebook (H, S, d)`` on ``keys (H, N, d)``."""
    return float(usage_perplexity(assigned_counts(keys, codebook)).mean())


def main(checkpoint: str, overrides: list[str]) -> None:
    torch.set_num_threads(1)
    model, data = recall_model(overrides, checkpoint)
    model.eval()
    keys: dict[int, list[Tensor]] = {i: [] for i in range(len(model.blocks))}

    def hook(layer: int) -> Callable[[nn.Module, tuple[Tensor, ...]], None]:
        def attention_input(module: nn.Module, args: tuple[Tensor, ...]) -> None:
            k = args[1]  # (B, H, T, d)
            keys[layer].append(module.quantizer.search_keys(k) if hasattr(module, "quantizer") else k)

        return attention_input

    for i, block in enumerate(model.blocks):
        block.attn.register_forward_pre_hook(hook(i))
    with torch.no_grad():
        for i in range(BATCHES):
            model(data.train_sampler().batch(10_000 + i)["input"])
    g = torch.Generator().manual_seed(0)
    for layer, parts in keys.items():
        k = torch.cat(parts).transpose(0, 1).flatten(1, 2).float()  # (H, N, d)
        sample = k[:, torch.randperm(k.shape[1], generator=g)[:SAMPLE]]
        fresh = kmeans(sample, CODES, REGRET_ITERS, torch.Generator().manual_seed(0))
        line = f"layer {layer}: k-means usage {usage(k, fresh):5.1f} / {CODES}, unexplained {unexplained(k, fresh):.3f}"
        attn = model.blocks[layer].attn
        if hasattr(attn, "quantizer"):
            codebook = attn.quantizer.codebook.detach()
            line += f"; codebook usage {usage(k, codebook):5.1f}, unexplained {unexplained(k, codebook):.3f}"
        print(line)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
