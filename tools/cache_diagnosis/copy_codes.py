"""``python -m tools.cache_diagnosis.copy_codes RUN_DIR [RUN_DIR ...]``: can a trained VQ model's cache address the
repeat probe's source at all? Per VQ layer, on the test set's repeated bytes.

A VQ layer's cache keeps one value sum per code, so the best any query can read is the code of the source key:
for target ``x[t+1]``, copied from ``d`` bytes back, the key at ``j = t + 1 - d`` (whose value holds the byte to
copy). Its code also holds every other cached key the quantiser put there (positions ``< (t // L - 1) L``, as
:mod:`copy_oracle`). With a one-hot byte as each value, the best read is the bytes of that code's cached keys: the
accuracy of their most frequent byte and the bits of the target under their counts (:func:`copy_oracle.oracle_bits`),
and how many cached keys share the source's code. The code also depends on the byte to copy (a smeared key mixes
it with the previous one), which the query does not know: the last two figures, ``H(byte | code)`` and
``H(previous byte | code)`` over every test key (plug-in estimates, bits), say which of the two the codes name; a
query that knows only the previous byte finds its source's code only if they name that one. Against
``copy_oracle.py``'s bound with one code per preceding byte (0.67 / 0.75 bits/byte on ``repeat_smear``'s probe),
this says whether the codes the model learnt can carry the copy; whether its queries find them is the
evaluation's bits. ``RUN_DIR`` is a training run's folder (its
``checkpoints/last.ckpt``, read by the safe loader and rebuilt from its stored run), e.g. ``studies/repeat_smear/runs/vq--copy_only--s1``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from tools.cache_diagnosis.copy_oracle import oracle_bits
from tvq_exp.batch import IGNORE_INDEX
from tvq_exp.run.build import build_data, load_checkpoint


def source_code_reads(
    inputs: np.ndarray,
    targets: np.ndarray,
    buckets: np.ndarray,
    codes: np.ndarray,
    distances: list[int],
    block_len: int,
) -> tuple[int, float, float, float]:
    """(targets, accuracy, bits/byte, mean cached keys sharing the source's code) of reading, for every scored
    target ``t`` of ``targets (N, T)``, the cached keys of the source key's code (``codes (N, T)``)."""
    n, right, bits, shared = 0, 0, 0.0, 0
    for x, y, bucket, code in zip(inputs, targets, buckets, codes, strict=True):
        for t in np.flatnonzero(y != IGNORE_INDEX):
            source = t + 1 - distances[bucket[t]]
            cache_end = max(0, (t // block_len - 1) * block_len)
            if not 0 <= source < cache_end:
                raise ValueError(f"source {source} of target {t} is not in the cache [0, {cache_end})")
            same = np.flatnonzero(code[:cache_end] == code[source])
            b, r = oracle_bits(x[same], int(y[t]))
            n, right, bits, shared = n + 1, right + r, bits + b, shared + same.size
    return n, right / n, bits / n, shared / n


def conditional_entropy(labels: np.ndarray, codes: np.ndarray) -> float:
    """``H(label | code)`` in bits, from the joint counts of two equal-length integer arrays (a plug-in estimate)."""
    joint = np.unique(np.stack([codes.ravel(), labels.ravel()]), axis=1, return_counts=True)[1]
    marginal = np.unique(codes.ravel(), return_counts=True)[1]
    n = codes.size

    def entropy(counts: np.ndarray) -> float:
        p = counts / n
        return float(-(p * np.log2(p)).sum())

    return entropy(joint) - entropy(marginal)


def vq_codes(model: nn.Module, inputs: Tensor) -> dict[int, np.ndarray]:
    """Per VQ layer, the code of every position's key, ``(N, H, T)``, in evaluation mode."""
    codes: dict[int, list[Tensor]] = {}
    for i, block in enumerate(model.blocks):
        quantizer = getattr(block.attn, "quantizer", None)
        if quantizer is not None:
            quantizer.register_forward_hook(lambda _m, _a, out, i=i: codes.setdefault(i, []).append(out[1]))
    model.eval()
    with torch.no_grad():
        for part in inputs.split(32):
            model(part)
    return {i: torch.cat(parts).numpy() for i, parts in codes.items()}


def trained_run(run_dir: Path) -> tuple[nn.Module, object, int]:
    """The model (the run's last checkpoint), its data module and ``block_len``."""
    module, config, _ = load_checkpoint(run_dir / "checkpoints" / "last.ckpt")
    return module.model, build_data(config["data"]), int(config["model"]["attention"]["block_len"])


def main(run_dirs: list[str]) -> None:
    torch.set_num_threads(1)
    for run_dir in map(Path, run_dirs):
        model, data, block_len = trained_run(run_dir)
        test = data.eval_examples("test")
        for layer, codes in vq_codes(model, torch.from_numpy(test.input).long()).items():
            for head in range(codes.shape[1]):
                code = codes[:, head]
                n, acc, bits, shared = source_code_reads(
                    test.input, test.target, test.bucket, code, list(data.task.distances), block_len
                )
                own = conditional_entropy(test.input[:, 1:], code[:, 1:])
                previous = conditional_entropy(test.input[:, :-1], code[:, 1:])
                print(
                    f"{run_dir.name} | layer {layer} head {head} | {n} targets | accuracy {acc:.4f} | "
                    f"{bits:.4f} bits/byte | {shared:.1f} cached keys share the source's code | "
                    f"H(byte | code) {own:.2f}, H(previous byte | code) {previous:.2f} bits"
                )


if __name__ == "__main__":
    main(sys.argv[1:])
