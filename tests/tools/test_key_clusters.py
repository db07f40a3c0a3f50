"""``tools/mqar_diagnosis/key_clusters.py``: the unexplained variance and usage against hand computations, and a run
over a VQ and a dense recall_cpu checkpoint (its keys hooked from every layer)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import torch

from tests.helpers.paths import REPO

_spec = importlib.util.spec_from_file_location(
    "key_clusters", REPO / "tools" / "mqar_diagnosis" / "key_clusters.py"
)
key_clusters = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(key_clusters)


def test_unexplained_variance_and_usage_by_hand() -> None:
    keys = torch.tensor([[[0.0], [2.0], [10.0], [12.0]]])  # (H 1, N 4, d 1), mean 6
    codebook = torch.tensor([[[1.0], [11.0], [100.0]]])  # two codes take two keys each, one none
    # every key is 1 from its code: 4 / (36 + 16 + 16 + 36)
    assert key_clusters.unexplained(keys, codebook) == pytest.approx(4 / 104)
    assert key_clusters.unexplained(keys, keys) == 0.0
    assert key_clusters.usage(keys, codebook) == pytest.approx(2.0)  # two codes used evenly
    assert key_clusters.usage(keys, keys) == pytest.approx(4.0)


@pytest.mark.parametrize("model", ["gau_vq", "gau_dense"])
def test_it_reports_every_layer(model: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    net, _ = key_clusters.recall_model([f"model={model}"])
    checkpoint = tmp_path / "last.ckpt"
    torch.save({"state_dict": {f"model.{k}": v for k, v in net.state_dict().items()}}, checkpoint)
    key_clusters.main(str(checkpoint), [f"model={model}"])
    lines = capsys.readouterr().out.splitlines()[-2:]
    number = r"\s*[\d.]+"
    pattern = rf"layer [01]: k-means usage{number} / 64, unexplained{number}"
    if model == "gau_vq":
        pattern += rf"; codebook usage{number}, unexplained{number}"
    assert [bool(re.fullmatch(pattern, line)) for line in lines] == [True, True], lines
    usages = [float(x) for line in lines for x in re.findall(r"usage\s*([\d.]+)", line)]
    assert all(1 <= u <= 64 for u in usages)
