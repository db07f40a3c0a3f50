"""``python -m tools.vq_cache_learning.previous_token [--seed N] [--page docs/vq_cache_learning.md]``: does any
row of the cache-learning study grow the previous-token feature MQAR needs? For every trained ``mqar`` job of the
seed (its ``studies/vq_cache_learning/runs/<job>/checkpoints/last.ckpt``), the linear probe of
``tools/mqar_diagnosis/previous_token_probe.py``: at the value positions, held-out accuracy for the key token before
them (chance 1/127) and, the control, the position's own token, in layer 0's output, layer 1's keys and layer 1's
quantised keys. Writes ``studies/vq_cache_learning/probes/mqar--previous-token--s<seed>.json`` and, with ``--page``,
the table between the page's ``<!-- previous token: begin -->`` and ``<!-- previous token: end -->`` lines.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from tools.mqar_diagnosis.previous_token_probe import probe
from tools.vq_cache_learning.common import OUT, rows_table, trained_vq_jobs
from tvq_exp.tools.study.report import replace_between


def table(results: dict[str, dict[str, dict[str, float]]]) -> str:
    features = ["layer-0 output", "layer-1 key", "layer-1 quantised key"]
    columns = [f"{f}: previous / own" for f in features]
    return rows_table(columns, {run: dict(zip(columns, (found[f] for f in features), strict=True))
                                for run, found in results.items()},
                      lambda found, c: f"{found[c]['previous']:.3f} / {found[c]['own']:.3f}")  # fmt: skip


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="previous_token.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=OUT, help="the study folder (runs/ and probes/)")
    parser.add_argument(
        "--page", default=None, help="write the table into this page's previous-token markers"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    results = {}
    for run, checkpoint, overrides in trained_vq_jobs(args.out, args.seed):
        results[run] = probe(checkpoint, overrides)
        print(table({run: results[run]}).splitlines()[-1], flush=True)
    target = OUT / "probes" / f"mqar--previous-token--s{args.seed}.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(results, indent=1) + "\n")
    if args.page:
        page = Path(args.page)
        page.write_text(replace_between(page.read_text(), "previous token", table(results)))


if __name__ == "__main__":
    main(sys.argv[1:])
