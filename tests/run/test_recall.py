"""MQAR on CPU (``experiment=recall_cpu``, docs/recall.md): dense attention solves it; Transformer-VQ without its
cache cannot recall a pair further back than its receptive field (layers x M tokens: without the cache, VQ
attention is a sliding window over the distances 0..M), with it, it can try."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from tests.helpers.paths import CONF
from tvq_exp.run.train import train

QUIET = ["trainer.enable_progress_bar=false", "trainer.accelerator=cpu", "trainer.precision=32-true"]
STEPS = ["trainer.max_steps=2000", "trainer.val_check_interval=1000"]  # the preset's budget


def recall(overrides: list[str], output_dir: Path) -> dict:
    """Train ``experiment=recall_cpu`` with ``overrides``; the final validation's accuracy."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(
            "train",
            overrides=["experiment=recall_cpu", *STEPS, *QUIET, *overrides, f"paths.output_dir={output_dir}"],
        )
    return train(cfg)["val"]["accuracy"]


def far_buckets(accuracy: dict, reach: int) -> list[dict]:
    """The answer buckets ``gap_<lo>_<hi>`` whose every gap is at least ``reach``."""
    return [b for b in accuracy["buckets"] if b["count"] and int(b["name"].split("_")[1]) >= reach]


@pytest.mark.slow
def test_dense_solves_mqar_and_vq_without_cache_fails_beyond_its_reach(tmp_path: Path) -> None:
    """About 20 minutes on 2 CPU cores (``make test-slow``)."""
    dense = recall(["model=gau_dense"], tmp_path / "dense")
    nocache = recall(["model=gau_vq", "model.attention.use_cache=false"], tmp_path / "nocache")
    reach = 2 * 16  # n_layers x M (recall_cpu: 2 layers, M = L = 16)
    far = far_buckets(nocache, reach)
    print(f"\nMQAR (128, 8): dense {dense['accuracy']:.4f}; VQ without cache {nocache['accuracy']:.4f}, "
          f"gaps >= {reach}: {[(b['name'], round(b['accuracy'], 4)) for b in far]}")  # fmt: skip
    assert dense["accuracy"] >= 0.99
    # chance: 1/128 over the value half of the vocabulary, 1/8 for a guess among the sequence's 8 values
    assert far and all(b["accuracy"] < 0.2 for b in far)
