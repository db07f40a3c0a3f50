"""``python -m tools.vq_cache_learning.code_spread --runs A,B [--seeds 1,2,3] [--out DIR] [--page docs/vq_cache_learning.md]``:
how many of the codebook's codes do the keys MQAR's reads need get?

On the test split of a trained ``mqar`` job, layer 1's codes (the first key head's) at the value positions (1, 3, ..,
15: the keys whose previous token is a pair's key, which a query must find) against those at every other position.
Per job:

- the usage perplexity of the codes at the value positions, and at the other positions;
- ``H(code | key token)`` (nats) at the value positions: 0 when the code is a function of the pair's key;
- the share of value positions whose code another value position of the same sequence has (measured), and the
  share that independent draws from the value positions' code distribution ``p`` would give
  (``1 - sum_z p_z (1 - p_z)^(P - 1)``, ``P = 8`` pairs): the birthday bound that the codes' spread sets;
- the value positions' share of layer 1's squared key gradient ``||∂L/∂k_hat||²`` (the recall loss on the first
  test batch), for the trained weights and for the same row's initialisation: where a codebook fitted by that weight
  (``codebook.fit_weight=fisher``) would put its codes;
- the job's test accuracy (its result file).

Writes ``studies/vq_cache_learning/probes/mqar--code-spread.json`` (a row per job, ``<row> s<seed>``, merged into
the file's) and, with ``--page``, the table between the page's ``<!-- code spread: begin -->`` and
``<!-- code spread: end -->`` lines.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from tools.mqar_diagnosis.common import recall_model
from tools.vq_cache_learning.common import OUT, probed_before, rows_table, trained_vq_jobs, write_probe
from tvq_exp.batch import IGNORE_INDEX

PAIRS = 8  # MQAR (128, 8): keys at positions 0, 2, .., 14, their values at 1, 3, .., 15
COLUMNS = {
    "value_perplexity": "value positions' code perplexity",
    "other_perplexity": "other positions' code perplexity",
    "entropy_given_key": "H(code given key), nats",
    "shared": "value codes shared: measured",
    "shared_if_independent": "if drawn independently",
    "gradient_share": "value positions' share of squared key gradient",
    "gradient_share_init": "the same at initialisation",
    "accuracy": "test accuracy",
}


def perplexity(codes: Tensor) -> float:
    """``exp`` of the entropy of the codes' empirical distribution (``codes``: any shape, int)."""
    p = torch.bincount(codes.flatten()).double()
    p = p[p > 0] / p.sum()
    return math.exp(-float((p * p.log()).sum()))


def entropy_given(codes: Tensor, tokens: Tensor) -> float:
    """``H(code | token)`` in nats over paired ``codes`` and ``tokens`` (same shape)."""
    codes, tokens = codes.flatten(), tokens.flatten()
    total = 0.0
    for token in tokens.unique():
        chosen = codes[tokens == token]
        total += len(chosen) / len(codes) * math.log(perplexity(chosen))
    return total


def shared_share(codes: Tensor) -> float:
    """Share of the entries of ``codes`` ``(N, P)`` whose code another entry of the same row has."""
    same = codes[:, :, None] == codes[:, None, :]
    return float(((same.sum(-1) - 1) > 0).double().mean())


def independent_shared_share(codes: Tensor, pairs: int) -> float:
    """The :func:`shared_share` that ``pairs`` independent draws from the empirical distribution of ``codes``
    would give: ``1 - sum_z p_z (1 - p_z)^(pairs - 1)``."""
    p = torch.bincount(codes.flatten()).double()
    p = p / p.sum()
    return float(1 - (p * (1 - p) ** (pairs - 1)).sum())


def spread(model: torch.nn.Module, data) -> dict[str, float]:  # noqa: ANN001
    """The columns but ``accuracy`` for one trained model on its test split."""
    found: list[Tensor] = []

    def keep(module: torch.nn.Module, args: tuple) -> None:
        found.append(module.quantizer(args[1])[1][:, 0])  # (B, T): the first key head's codes

    hook = model.blocks[-1].attn.register_forward_pre_hook(keep)
    inputs = []
    with torch.no_grad():
        for batch in data.test_dataloader():
            model(batch["input"])
            inputs.append(batch["input"])
    hook.remove()
    codes, tokens = torch.cat(found), torch.cat(inputs)
    values, keys = codes[:, 1 : 2 * PAIRS : 2], tokens[:, 0 : 2 * PAIRS : 2]
    return {
        "value_perplexity": perplexity(values),
        "other_perplexity": perplexity(torch.cat([codes[:, 0 : 2 * PAIRS : 2], codes[:, 2 * PAIRS :]], 1)),
        "entropy_given_key": entropy_given(values, keys),
        "shared": shared_share(values),
        "shared_if_independent": independent_shared_share(values, PAIRS),
    }


def gradient_share(model: torch.nn.Module, data) -> float:  # noqa: ANN001
    """The value positions' share of ``sum ||∂L/∂k_hat||²`` over layer 1's keys, for the recall loss (cross-entropy at
    the answers) on the first test batch."""
    kept: list[Tensor] = []

    def keep(module: torch.nn.Module, args: tuple, out: tuple) -> None:
        out[0].retain_grad()
        kept.append(out[0])

    hook = model.blocks[-1].attn.quantizer.register_forward_hook(keep)
    batch = next(iter(data.test_dataloader()))
    logits = model(batch["input"]).logits
    F.cross_entropy(logits.flatten(0, 1), batch["target"].flatten(), ignore_index=IGNORE_INDEX).backward()
    hook.remove()
    mass = kept[0].grad.pow(2).sum(-1)  # (B, H, T)
    return float(mass[..., 1 : 2 * PAIRS : 2].sum() / mass.sum())


def test_accuracy(job_id: str) -> float:
    """The job's test accuracy from its result file (``studies/vq_cache_learning/results/<job>.json``)."""
    result = json.loads((OUT / "results" / f"{job_id}.json").read_text())
    return float(result["evaluations"]["test"]["accuracy"]["accuracy"])


def cell(found: dict[str, float], column: str) -> str:
    """One table cell: perplexities to 0.1, the rest to 0.001."""
    key = next(k for k, name in COLUMNS.items() if name == column)
    return f"{found[key]:.{1 if key.endswith('perplexity') else 3}f}"


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="code_spread.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", required=True, help="comma-separated rows")
    parser.add_argument("--seeds", default="1", help="comma-separated seeds")
    parser.add_argument(
        "--out", type=Path, default=OUT, help="the study folder whose runs/ hold the checkpoints"
    )
    parser.add_argument("--page", default=None, help="write the table into this page's code-spread markers")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    results = probed_before("mqar--code-spread")
    for seed in (int(s) for s in args.seeds.split(",")):
        for run, checkpoint, overrides in trained_vq_jobs(args.out, seed, args.runs):
            model, data = recall_model(overrides, checkpoint)
            model.eval()
            data.setup("test")
            found = spread(model, data) | {"gradient_share": gradient_share(model, data)}
            initial, _ = recall_model(overrides)
            found["gradient_share_init"] = gradient_share(initial.eval(), data)
            results[f"{run} s{seed}"] = found | {"accuracy": test_accuracy(f"{run}--mqar--s{seed}")}
            print(f"{run} s{seed}: {found}", flush=True)
    results = dict(sorted(results.items()))
    table = rows_table(list(COLUMNS.values()), results, cell)
    print(table)
    write_probe("mqar--code-spread", results, table, args.page, "code spread")


if __name__ == "__main__":
    main(sys.argv[1:])
