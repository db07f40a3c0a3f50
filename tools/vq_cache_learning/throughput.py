"""``python tools/vq_cache_learning/throughput.py [--page docs/vq_cache_learning.md]``: the training-throughput cost of
each cache-read option of the cache-learning study, from the ``python -m tvq_exp.bench model`` records in
``studies/vq_cache_learning/throughput/*.json`` (``tools/vq_cache_learning/throughput.sh`` makes them: ``gau_vq`` at
T = 8192, one thread, the official layer timed first and last). Each option's tokens/s against the mean of the two
official runs; with ``--page``, the table between the page's ``<!-- throughput: begin -->`` and ``<!-- throughput: end
-->`` lines.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from tvq_exp.tools.study.report import replace_between

FOLDER = Path(__file__).resolve().parents[2] / "studies/vq_cache_learning/throughput"
BASELINES = ("base", "base2")


def table(folder: Path = FOLDER) -> str:
    records = {path.stem: json.loads(path.read_text())[0] for path in sorted(folder.glob("*.json"))}
    base = statistics.fmean(records[name]["tokens_per_s"] for name in BASELINES)
    lines = [
        "| run | model | overrides | T | tokens/s | against the official layer |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in records.items():
        overrides = ", ".join(f"`{o}`" for o in r["overrides"]) or "—"
        change = r["tokens_per_s"] / base - 1
        lines.append(
            f"| {name} | {r['backend']} | {overrides} | {r['seq_len']} | {r['tokens_per_s']:.0f} | {change:+.1%} |"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="throughput.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--page", default=None, help="write the table into this page's throughput markers")
    args = parser.parse_args(argv)
    text = table()
    if args.page:
        page = Path(args.page)
        page.write_text(replace_between(page.read_text(), "throughput", text))
    print(text)


if __name__ == "__main__":
    main(sys.argv[1:])
