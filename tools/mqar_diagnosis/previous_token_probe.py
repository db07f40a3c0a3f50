"""``python -m tools.mqar_diagnosis.previous_token_probe CHECKPOINT [overrides]``: does a trained recall_cpu
model know, at MQAR's value positions, the key token before them? A ridge-regression linear probe (features ->
one-hot token) of layer 0's output, layer 1's keys and layer 1's quantised keys, for the preceding token and
(a control) the position's own token; held-out accuracy (chance 1/127; docs/mqar_diagnosis.md)."""

from __future__ import annotations

import sys

import torch
from torch import Tensor

from tools.mqar_diagnosis.common import recall_model

BATCHES = 24


def probe_accuracy(x: Tensor, y: Tensor, ridge: float = 1e-3) -> float:
    """Held-out (last third) accuracy of a ridge regression from ``x (N, d)`` to one-hot ``y (N,)``."""
    x = torch.cat([x.double(), torch.ones(len(x), 1, dtype=torch.float64)], 1)
    n = len(x) * 2 // 3
    target = torch.nn.functional.one_hot(y, 256).double()
    w = torch.linalg.solve(
        x[:n].T @ x[:n] + ridge * torch.eye(x.shape[1], dtype=x.dtype), x[:n].T @ target[:n]
    )
    return float(((x[n:] @ w).argmax(1) == y[n:]).double().mean())


def probe(checkpoint: str, overrides: list[str]) -> dict[str, dict[str, float]]:
    """Per feature (layer 0's output, layer 1's keys, its quantised keys): the probe's held-out accuracy for the
    ``previous`` (key) token and, the control, the position's ``own`` token."""
    model, data = recall_model(overrides, checkpoint)
    model.eval()
    feats: dict[str, list[Tensor]] = {"layer-0 output": [], "layer-1 key": [], "layer-1 quantised key": []}

    def block_input(module: torch.nn.Module, args: tuple[Tensor, ...]) -> None:
        feats["layer-0 output"].append(args[0][:, 1:16:2])

    def attention_input(module: torch.nn.Module, args: tuple[Tensor, ...]) -> None:
        feats["layer-1 key"].append(args[1][:, 0, 1:16:2])
        feats["layer-1 quantised key"].append(module.quantizer(args[1])[0][:, 0, 1:16:2])

    model.blocks[1].register_forward_pre_hook(block_input)
    model.blocks[1].attn.register_forward_pre_hook(attention_input)
    previous, own = [], []
    with torch.no_grad():
        for i in range(BATCHES):
            batch = data.train_sampler().batch(10_000 + i)
            model(batch["input"])
            previous.append(batch["input"][:, 0:16:2])
            own.append(batch["input"][:, 1:16:2])
    previous, own = torch.cat(previous).flatten(), torch.cat(own).flatten()
    found = {}
    for name, xs in feats.items():
        x = torch.cat(xs).flatten(0, 1)
        found[name] = {"previous": probe_accuracy(x, previous), "own": probe_accuracy(x, own)}
    return found


def main(checkpoint: str, overrides: list[str]) -> None:
    torch.set_num_threads(1)
    for name, acc in probe(checkpoint, overrides).items():
        print(f"{name:22s} previous token {acc['previous']:.3f}  own token {acc['own']:.3f}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
