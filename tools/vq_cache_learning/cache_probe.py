"""``python tools/vq_cache_learning/cache_probe.py REGIME [--seed N] [--checkpoints [--out DIR]] [--page PAGE]``:
what each row of the cache-learning study (conf/study/vq_cache_learning.yaml) does to the keys that only the cache
reads, on one training batch of ``REGIME`` (``copy_only``, ``copy_short`` or ``mqar``), from the row's seeded
initialisation (or, with ``--checkpoints``, its trained weights in ``<out>/runs/<job>/checkpoints/last.ckpt``, ``out``
``studies/vq_cache_learning`` unless ``--out`` names another folder of the study).

The **cache-only keys** of a batch are the positions ``j`` that no supervised position reads through its exact window:
every target position ``t >= j`` lies two or more blocks after ``j``. In the last layer their keys reach the loss through the
cache alone (in a lower layer also through the later layers' windows of unsupervised positions, so the page's table
shows the last layer; the JSON file has every layer). Per layer it measures:

- ``key grad``: the mean norm of the task loss's gradient (cross-entropy only) at the cache-only keys: what the
  remedy sends them. The official cache sends none (the scores read the detached codes), so VQ's row must be 0.
- ``code grad``: the norm of the task gradient reaching the codebook (a trainable codebook only; else blank).
- ``forward``: ``|L(k + ε·u) - L(k)| / ε`` for a random unit direction ``u`` per cache-only key and
  ``ε = 1e-4·|k|``: whether the forward pass feels a small move of a cached key that changes no nearest code (0 for
  every cache that reads codes; the mean-key cache and dense feel it).

Writes ``studies/vq_cache_learning/probes/<regime>--<init|trained>--s<seed>.json`` and, with ``--page``, the table
between the page's ``<!-- probe REGIME: begin -->`` and ``<!-- probe REGIME: end -->`` lines.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import hydra
import torch
from hydra import compose, initialize_config_dir
from torch import Tensor

import tvq_exp.resolvers  # noqa: F401  (registers the tvq.* interpolations)
from tvq_exp.batch import IGNORE_INDEX
from tvq_exp.quantize.codebook import statistics_frozen
from tvq_exp.run.checkpoints import read_weights
from tvq_exp.tools.study.report import replace_between
from tvq_exp.tools.study.spec import load_study

REPO = Path(__file__).resolve().parents[2]
STUDY = REPO / "conf/study/vq_cache_learning.yaml"
OUT = REPO / "studies/vq_cache_learning"


def build(overrides: list[str], seed: int, checkpoint: Path | None):  # noqa: ANN201
    """The decoder (seeded initialisation or a checkpoint's weights) and one training batch of ``overrides``."""
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        cfg = compose("train", overrides=[*overrides, f"seed={seed}"])
        torch.manual_seed(seed)
        model, data = hydra.utils.instantiate(cfg.model), hydra.utils.instantiate(cfg.data)
    if checkpoint is not None:
        weights = read_weights(checkpoint)
        weights = weights.get("state_dict", weights)
        model.load_state_dict({k[6:]: v for k, v in weights.items() if k.startswith("model.")}, strict=False)
    data.setup("fit")
    return model.double(), data.train_sampler(0).batch(3), int(cfg.block_len)


def cache_only(target: Tensor, block_len: int) -> Tensor:
    """``(B, T)``: True at the positions no supervised position ``t >= j`` reads through its window (the block of
    ``j`` or the next one)."""
    supervised = target != IGNORE_INDEX
    block = torch.arange(target.shape[1]) // block_len
    reads = (block[None, :] - block[:, None] <= 1) & (block[None, :] >= block[:, None])  # (j, t)
    seen = (supervised[:, None, :] & reads[None]).any(-1)  # (B, j)
    return ~seen


def loss_of(model: torch.nn.Module, batch: dict[str, Tensor]) -> Tensor:
    """The task loss (cross-entropy only); the generator re-seeded, so a sampled assignment draws the same codes."""
    torch.manual_seed(0)
    logits = model(batch["input"]).logits
    return torch.nn.functional.cross_entropy(
        logits.flatten(0, 1).double(), batch["target"].flatten(), ignore_index=IGNORE_INDEX
    )


def probe(overrides: list[str], seed: int, checkpoint: Path | None) -> list[dict[str, float | None]]:
    """Per layer: the cache-only keys' gradient norm, the codebook's gradient norm, the forward's response."""
    model, batch, block_len = build(overrides, seed, checkpoint)
    model.train()
    far = cache_only(batch["target"], block_len)
    keys: list[Tensor] = []
    push: dict[int, Tensor] = {}

    def hook(index: int):  # noqa: ANN202
        def pre(module: torch.nn.Module, args: tuple) -> tuple:
            k = args[1]
            if index in push:
                k = k + push[index]
            if k.requires_grad:
                k.retain_grad()
            keys.append(k)
            return (args[0], k, *args[2:])

        return pre

    hooks = [block.attn.register_forward_pre_hook(hook(i)) for i, block in enumerate(model.blocks)]
    with statistics_frozen():
        base = loss_of(model, batch)
        base.backward()
        rows = []
        grads = [k.grad for k in keys]
        for i, block in enumerate(model.blocks):
            mask = far[:, None, :].expand(-1, grads[i].shape[1], -1)  # (B, H, T)
            norm = grads[i].norm(dim=-1)[mask].mean().item() if mask.any() else float("nan")
            codebook = getattr(getattr(block.attn, "quantizer", None), "embed", None)
            code = None if codebook is None or codebook.grad is None else codebook.grad.norm().item()
            k = keys[i].detach()
            u = torch.randn_like(k)
            u = u / u.norm(dim=-1, keepdim=True)
            eps = 1e-4 * k.norm(dim=-1, keepdim=True)
            push.clear()
            push[i] = (eps * u) * mask[..., None]
            keys.clear()
            moved = loss_of(
                model, batch
            ).detach()  # with gradients on: a sampled assignment draws as in training
            scale = eps[mask].mean().item()
            rows.append({"layer": i, "key_grad": norm, "code_grad": code,
                         "forward": abs(moved.item() - base.item()) / scale})  # fmt: skip
            push.clear()
    for h in hooks:
        h.remove()
    return rows


def table(results: dict[str, list[dict]]) -> str:
    """The last layer's row of each study row (below it a cache-only position's key also reaches the loss through
    the later layers' windows of unsupervised positions; the JSON file has every layer)."""
    lines = ["| row | layer | key grad (cache-only keys) | code grad | forward |", "|---|---|---|---|---|"]
    for run, rows in results.items():
        for r in rows[-1:]:
            code = "" if r["code_grad"] is None else f"{r['code_grad']:.2e}"
            lines.append(f"| {run} | {r['layer']} | {r['key_grad']:.2e} | {code} | {r['forward']:.2e} |")
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="cache_probe.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("regime", choices=["copy_only", "copy_short", "mqar"])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--checkpoints", action="store_true", help="the trained weights of each row's job")
    parser.add_argument("--runs", default="", help="comma-separated rows (default: all)")
    parser.add_argument(
        "--out", type=Path, default=OUT, help="the study folder whose runs/ hold the checkpoints"
    )
    parser.add_argument("--page", default=None, help="write the table into this page's probe markers")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    study = load_study(STUDY)
    results = {}
    for job in study.jobs:
        if (
            job.regime != args.regime
            or job.seed != args.seed
            or (args.runs and job.run not in args.runs.split(","))
        ):
            continue
        checkpoint = args.out / "runs" / job.id / "checkpoints/last.ckpt" if args.checkpoints else None
        if checkpoint is not None and not checkpoint.is_file():
            continue
        results[job.run] = probe(list(job.overrides), job.seed, checkpoint)
        print(table({job.run: results[job.run]}).splitlines()[-1], flush=True)
    kind = "trained" if args.checkpoints else "init"
    target = OUT / "probes" / f"{args.regime}--{kind}--s{args.seed}.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(results, indent=1) + "\n")
    if args.page:
        page = Path(args.page)
        marker = f"probe {args.regime} {kind}"
        page.write_text(replace_between(page.read_text(), marker, table(results)))
        print(f"wrote {len(results)} rows into {page}")


if __name__ == "__main__":
    main(sys.argv[1:])
