"""``python -m tools.mqar_diagnosis.key_gradients [CHECKPOINT]``: how much of the recall loss's gradient
reaches each layer's keys at the pair positions of MQAR (recall_cpu: pairs at positions 0..15, keys at even
and values at odd positions), for the same weights under VQ, VQ with ``cache_key_grad`` and dense attention,
with the cosine between each VQ gradient and dense's (one training batch; docs/mqar_diagnosis.md)."""

from __future__ import annotations

import sys

import torch
from torch import Tensor

from tools.mqar_diagnosis.common import recall_model
from tvq_exp.batch import IGNORE_INDEX

VARIANTS = {
    "vq": ["model=gau_vq"],
    "vq_cache_key_grad": ["model=gau_vq", "model.attention.cache_key_grad=true"],
    "dense": ["model=gau_dense"],
}


def key_gradients(overrides: list[str], checkpoint: str | None) -> tuple[float, list[Tensor]]:
    """The loss of one training batch and ``∂L/∂k`` of every block's keys ``(B, H, T, d_k)``."""
    model, data = recall_model(overrides, checkpoint)
    model.train()
    batch = data.train_sampler().batch(7)
    keys: list[Tensor] = []

    def keep(module: torch.nn.Module, args: tuple[Tensor, ...]) -> None:
        args[1].retain_grad()
        keys.append(args[1])

    hooks = [block.attn.register_forward_pre_hook(keep) for block in model.blocks]
    logits = model(batch["input"]).logits
    loss = torch.nn.functional.cross_entropy(
        logits.flatten(0, 1), batch["target"].flatten(), ignore_index=IGNORE_INDEX
    )
    loss.backward()
    for hook in hooks:
        hook.remove()
    return float(loss), [k.grad for k in keys]


def by_position(x: Tensor) -> str:
    """``x (T,)`` averaged over the pair keys, the pair values and the query region."""
    return f"keys {x[0:16:2].mean():.2e} values {x[1:16:2].mean():.2e} rest {x[16:].mean():.2e}"


def main(checkpoint: str | None) -> None:
    torch.set_num_threads(1)
    grads = {}
    for name, overrides in VARIANTS.items():
        loss, grads[name] = key_gradients(overrides, checkpoint)
        norms = [by_position(g.norm(dim=-1).mean(dim=(0, 1))) for g in grads[name]]
        print(f"{name:18s} loss {loss:.3f} | " + " | ".join(f"L{i}: {n}" for i, n in enumerate(norms)))
    for name in ("vq", "vq_cache_key_grad"):
        cosines = [
            by_position(torch.nn.functional.cosine_similarity(g, d, dim=-1).mean(dim=(0, 1)))
            for g, d in zip(grads[name], grads["dense"], strict=True)
        ]
        print(f"cos({name}, dense) " + " | ".join(f"L{i}: {c}" for i, c in enumerate(cosines)))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
