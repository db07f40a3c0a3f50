"""``python -m tools.vq_cache_learning.collisions [--out DIR] [--runs a,b] [--page docs/vq_cache_learning.md]``: where
does a trained MQAR model of the cache-learning study fail? On the test split, every answer whose pair lies two or
more blocks before it is read through the cache; with ``cache_keys=mean`` the cache holds, per code, the mean of the
cached keys quantised to it. The answer is split by whether the pair's value position (where the key token is the
previous token) shares its layer-1 code with another cached position of the sequence (a **collision**: its key is
averaged with another's) or has the code to itself, with the accuracy of each part; of the shared ones, those whose
code another value position (another pair's answer) has; and the answers read through the window. Jobs: every
trained ``mqar`` job (``<out>/runs/<job>/checkpoints/last.ckpt``, seed 1 unless ``--seed``).
With ``--regime copy_short`` (the repeat probe at MQAR's size) the answers are the repeated bytes: a byte is read at
the earlier positions ``p`` whose previous byte is the query's byte and whose byte is the answer (the source span, and
for the second copy the first copy too); it is collided when another cached position, not such a ``p``, shares the
code of one of them.
Writes ``studies/vq_cache_learning/probes/<regime>--collisions--s<seed>.json`` (its rows merged into the file's: a
study trained in several folders is probed folder by folder) and, with ``--page``, the table between the page's
``<!-- collisions: begin -->`` and ``<!-- collisions: end -->`` lines (``collisions copy_short`` for the copy probe).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch import Tensor
from torch.utils.hooks import RemovableHandle

from tools.mqar_diagnosis.common import recall_model
from tools.vq_cache_learning.common import OUT, probed_before, rows_table, trained_vq_jobs, write_probe
from tvq_exp.batch import IGNORE_INDEX

PAIRS = 16  # MQAR (128, 8): keys at positions 0, 2, .., 14, their values at 1, 3, .., 15
WITH_VALUE = "of which with another value position"
COLUMNS = ("window", "cache, own code", "cache, shared code", WITH_VALUE)
EXPERIMENTS = {"mqar": "recall_cpu", "copy_short": "repeat_cpu"}  # each probed regime's experiment


def keep_codes(model: torch.nn.Module) -> tuple[list[Tensor], RemovableHandle]:
    """A list that each forward pass appends the last layer's codes to, ``(B, T)`` of the first key head, and the hook
    that fills it (remove it when done)."""
    codes: list[Tensor] = []

    def keep(module: torch.nn.Module, args: tuple) -> None:
        codes.append(module.quantizer(args[1])[1][:, 0])

    return codes, model.blocks[-1].attn.register_forward_pre_hook(keep)


def answers(model: torch.nn.Module, data, block_len: int) -> dict[str, list[int]]:  # noqa: ANN001
    """Per answer: read through the cache or the window, collided or not (cache reads), correct or not."""
    codes, hook = keep_codes(model)
    parts: dict[str, list[int]] = {name: [] for name in COLUMNS}
    with torch.no_grad():
        for batch in data.test_dataloader():
            codes.clear()
            correct = model(batch["input"]).logits.argmax(-1) == batch["target"]
            z = codes[0]
            for b, t in (batch["target"] != IGNORE_INDEX).nonzero().tolist():
                keys = batch["input"][b, 0:PAIRS:2]
                match = (keys == batch["input"][b, t]).nonzero()
                if len(match) == 0:
                    continue
                value = 2 * int(match[0]) + 1
                cached_end = (t // block_len - 1) * block_len  # positions of blocks <= r - 2
                if value >= cached_end:
                    parts["window"].append(int(correct[b, t]))
                    continue
                sharing = z[b, :cached_end] == z[b, value]
                sharing[value] = False
                right = int(correct[b, t])
                parts["cache, shared code" if bool(sharing.any()) else "cache, own code"].append(right)
                if bool(sharing[1:PAIRS:2].any()):
                    parts[WITH_VALUE].append(right)
    hook.remove()
    return parts


def copy_answers(model: torch.nn.Module, data, block_len: int) -> dict[str, list[int]]:  # noqa: ANN001
    """Per repeated byte of the copy probe: read through the window or the cache, collided or not, correct or not."""
    codes, hook = keep_codes(model)
    parts: dict[str, list[int]] = {name: [] for name in COLUMNS[:3]}
    with torch.no_grad():
        for batch in data.test_dataloader():
            codes.clear()
            tokens, target = batch["input"], batch["target"]
            correct = model(tokens).logits.argmax(-1) == target
            z = codes[0]
            for b, t in (target != IGNORE_INDEX).nonzero().tolist():
                earlier = torch.arange(1, t)
                sources = earlier[
                    (tokens[b, earlier - 1] == tokens[b, t]) & (tokens[b, earlier] == target[b, t])
                ]
                if len(sources) == 0:
                    continue
                cached_end = (t // block_len - 1) * block_len  # positions of blocks <= r - 2
                right = int(correct[b, t])
                if bool((sources >= cached_end).any()):
                    parts["window"].append(right)
                    continue
                sharing = torch.isin(z[b, :cached_end], z[b, sources])
                sharing[sources] = False
                parts["cache, shared code" if bool(sharing.any()) else "cache, own code"].append(right)
    hook.remove()
    return parts


def table(results: dict[str, dict[str, list[int]]]) -> str:
    columns = [f"{n}: answers, accuracy" for n in COLUMNS]

    def cell(parts: dict[str, list[int]], column: str) -> str:
        found = parts.get(column.split(":")[0])  # rows probed before the split into value positions: none
        return "–" if found is None else f"{len(found)}, {sum(found) / max(len(found), 1):.3f}"

    return rows_table(columns, results, cell)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="collisions.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=OUT, help="the study folder (runs/)")
    parser.add_argument(
        "--runs", default="", help="comma-separated rows (default: every trained row of the regime)"
    )
    parser.add_argument("--regime", default="mqar", choices=list(EXPERIMENTS), help="the study's task")
    parser.add_argument("--page", default=None, help="write the table into this page's collisions markers")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    name = f"{args.regime}--collisions--s{args.seed}"
    results = probed_before(name)  # rows probed before, from other folders
    read = answers if args.regime == "mqar" else copy_answers
    for run, checkpoint, overrides in trained_vq_jobs(args.out, args.seed, args.runs, args.regime):
        model, data = recall_model(overrides, checkpoint, EXPERIMENTS[args.regime])
        model.eval()
        data.setup("test")
        results[run] = read(model, data, model.blocks[-1].attn.block_len)
        print(table({run: results[run]}).splitlines()[-1], flush=True)
    marker = "collisions" if args.regime == "mqar" else f"collisions {args.regime}"
    write_probe(name, results, table(results), args.page, marker, indent=None)


if __name__ == "__main__":
    main(sys.argv[1:])
