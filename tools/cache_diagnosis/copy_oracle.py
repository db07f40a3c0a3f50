"""``python tools/cache_diagnosis/copy_oracle.py [train.py overrides]``: what a compressive cache *keyed on the
preceding bytes* could predict of the repeat probe's repeated bytes (docs/long_context.md), with no model.

The bound a Transformer-VQ layer with smeared keys meets at best. Its cache sums the values of the keys older than
the query's previous block, one sum per code; with a code per value of the ``context`` bytes before a key
(``context = 1``: what a smeared key adds to a byte), the query of position ``t`` reads the code of
``x[t-context+1..t]`` and gets the bytes that followed that context in the cache. The oracle predicts
``x[t+1]`` with those counts (``(1 - eps) * count / total + eps / 256``), and with the uniform 8 bits where no
cached context matches. It scores the test set's repeated bytes (the targets the probe scores), per distance:
accuracy of the most frequent next byte, bits/byte, and the share of targets whose context is not in the cache.
``block_len`` is ``L``: position ``t`` of block ``b = t // L`` sees blocks ``b - 1`` and ``b`` exactly, the
cache holds positions ``< (b - 1) L``. Prints one line per (context, distance), e.g. for the smeared-key study:
``python tools/cache_diagnosis/copy_oracle.py experiment=repeat_cpu block_len=32 data.seq_len=512
"data.task.distances=[128,256]" data.task.span=128 data.task.span_content=random``.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import hydra
import numpy as np
from hydra import compose, initialize_config_dir

import tvq_exp.resolvers  # noqa: F401  (registers the tvq.* interpolations)
from tvq_exp.batch import IGNORE_INDEX

CONF = Path(__file__).resolve().parents[2] / "conf"
EPS = 0.01  # the share an oracle keeps for bytes its cache never saw after the context
CONTEXTS = (1, 2)


def cached_next_bytes(x: np.ndarray, t: int, context: int, cache_end: int) -> np.ndarray:
    """The bytes ``x[j]`` (``context <= j < cache_end``) whose preceding ``context`` bytes equal ``x[t-context+1..t]``
    (``cache_end <= t``: the cache holds the past only)."""
    if cache_end > t:
        raise ValueError(
            f"cache_end={cache_end} must be <= t={t}: the cache holds positions before the query"
        )
    if cache_end <= context or t + 1 < context:
        return x[:0]
    key = x[t - context + 1 : t + 1]
    windows = np.lib.stride_tricks.sliding_window_view(
        x[: cache_end - 1], context
    )  # row i: x[i..i+context-1]
    match = (windows == key).all(-1)
    return x[np.flatnonzero(match) + context]


def oracle_bits(
    next_bytes: np.ndarray, target: int, eps: float = EPS, vocab: int = 256
) -> tuple[float, bool]:
    """Bits of ``target`` under the counts of ``next_bytes`` mixed with the uniform (the uniform alone when
    empty), and whether the most frequent byte is ``target``."""
    if next_bytes.size == 0:
        return math.log2(vocab), False
    counts = np.bincount(next_bytes, minlength=vocab)
    p = (1 - eps) * counts[target] / next_bytes.size + eps / vocab
    return -math.log2(p), bool(counts.argmax() == target and counts[target] > 0)


def score(
    inputs: np.ndarray, targets: np.ndarray, buckets: np.ndarray, block_len: int, context: int
) -> dict[int, tuple[int, float, float, float]]:
    """Per bucket: (targets, accuracy, bits/byte, share with no cached match)."""
    totals: dict[int, list[float]] = {}
    for x, y, bucket in zip(inputs, targets, buckets, strict=True):
        for t in np.flatnonzero(y != IGNORE_INDEX):
            cache_end = max(0, (t // block_len - 1) * block_len)
            nxt = cached_next_bytes(x, int(t), context, cache_end)
            bits, right = oracle_bits(nxt, int(y[t]))
            row = totals.setdefault(int(bucket[t]), [0, 0.0, 0.0, 0.0])
            row[0] += 1
            row[1] += right
            row[2] += bits
            row[3] += nxt.size == 0
    return {b: (int(n), a / n, s / n, m / n) for b, (n, a, s, m) in sorted(totals.items())}


def main(overrides: list[str]) -> None:
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        cfg = compose("train", overrides=overrides)
    data = hydra.utils.instantiate(cfg.data)
    test = data.eval_examples("test")
    names = data.bucket_names("test")
    for context in CONTEXTS:
        for bucket, (n, acc, bits, missing) in score(
            test.input, test.target, test.bucket, int(cfg.block_len), context
        ).items():
            print(
                f"context {context} | {names[bucket]} | {n} targets | accuracy {acc:.4f} | "
                f"{bits:.4f} bits/byte | no cached match {missing:.4f}"
            )


if __name__ == "__main__":
    main(sys.argv[1:])
