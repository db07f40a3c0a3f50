"""The logger presets researchers use: ``logger=wandb`` (W&B offline), ``logger=mlflow`` (a local SQLite file)
and ``logger=many`` (TensorBoard + CSV + W&B). Each receives the HParams equivalent: the run's config values
(a swept one included), its tags (``tags=[...]``) and its real final metrics."""

from __future__ import annotations

import csv
import json
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hydra import compose, initialize_config_dir
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2

from tests.helpers.paths import CONF
from tvq_exp.run.train import train

needs_data = pytest.mark.needs_data("text/gutenberg")
BLOCK = 32768  # bytes per block of a .wandb log
SWEPT = "model.attention.codebook_size=24"  # a value no preset has: it must reach the logger from the config
RUN = ["experiment=smoke", "trainer.max_steps=4", "trainer.val_check_interval=2", "trainer.enable_progress_bar=false",
       "torch_threads=1", SWEPT, "tags=[baseline,s24]"]  # fmt: skip
TAGS = "['baseline', 's24']"  # the tags as every logger's hyper-parameter


def run(logger: str, out: Path, *extra: str) -> dict[str, Any]:
    overrides = [*RUN, f"logger={logger}", f"paths.output_dir={out}", f"paths.log_dir={out / 'logs'}", *extra]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=overrides)
    return train(cfg, overrides)


def wandb_records(out: Path) -> Iterator[Any]:
    """The records of the offline W&B run in ``out``: its ``.wandb`` file is a LevelDB-style log (a 7-byte
    header, then 32 KiB blocks of records, each a 7-byte header ``crc32, length, kind`` and protobuf bytes
    split over blocks as FIRST/MIDDLE/LAST), which ``wandb sync`` uploads later."""
    from wandb.proto import wandb_internal_pb2

    (path,) = (out / "wandb").glob("offline-run-*/*.wandb")
    raw, pos, pending = path.read_bytes(), 7, b""
    while pos + 7 <= len(raw):
        if BLOCK - pos % BLOCK < 7:  # a block's tail too short for a header is padding
            pos += BLOCK - pos % BLOCK
            continue
        _, length, kind = struct.unpack("<IHB", raw[pos : pos + 7])
        pending, pos = pending + raw[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind in (1, 4):  # FULL or LAST: a whole record
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def _key(item: Any) -> str:
    return item.key or "/".join(item.nested_key)  # W&B stores "a/b" either whole or split


def wandb_run(out: Path, wait_s: float = 60.0) -> tuple[dict[str, Any], dict[str, Any]]:
    """The offline W&B run's config and its last values of every logged metric, once its log is complete
    (W&B's service process writes the closing ``exit`` record shortly after ``finish()`` returns)."""
    deadline = time.monotonic() + wait_s
    while True:
        records = list(wandb_records(out))
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    config: dict[str, Any] = {}
    metrics: dict[str, Any] = {}
    for record in records:
        kind = record.WhichOneof("record_type")
        if kind == "run":
            config["_tags"] = list(record.run.tags)
        elif kind == "config":
            config |= {_key(item): json.loads(item.value_json) for item in record.config.update}
        elif kind == "history":
            metrics |= {_key(item): json.loads(item.value_json) for item in record.history.item}
    return config, metrics


@needs_data
def test_many_loggers_tensorboard_csv_and_wandb_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    result = run("many", tmp_path)
    bpb = result["val"]["bpb"]
    assert (
        "├── model" in capsys.readouterr().out
    )  # the config tree, printed at the start (tvq_exp/run/extras.py)

    config, summary = wandb_run(tmp_path)
    assert config["model.attention.codebook_size"] == 24 and config["trainer.max_steps"] == 4
    assert config["tags"] == TAGS and config["_tags"] == ["baseline", "s24"]  # and W&B's own run tags
    assert summary["final/val_bpb"] == pytest.approx(bpb) and summary["final/global_step"] == 4

    hparams = yaml.safe_load((tmp_path / "csv" / "hparams.yaml").read_text())
    assert hparams["model.attention.codebook_size"] == 24 and hparams["tags"] == TAGS
    rows = list(csv.DictReader((tmp_path / "csv" / "metrics.csv").open()))
    final = [r for r in rows if r.get("final/val_bpb")]
    assert len(final) == 1 and float(final[0]["final/val_bpb"]) == pytest.approx(bpb)

    (events,) = (tmp_path / "tensorboard").glob("**/events.out.tfevents.*")
    acc = EventAccumulator(str(events), size_guidance={"tensors": 0, "scalars": 0})
    acc.Reload()
    assert acc.Scalars("final/val_bpb")[-1].value == pytest.approx(bpb)
    session = plugin_data_pb2.HParamsPluginData.FromString(
        acc.SummaryMetadata("_hparams_/session_start_info").plugin_data.content
    ).session_start_info
    assert session.hparams["tags"].string_value == TAGS


@needs_data
def test_mlflow_local_store(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    result = run("mlflow", tmp_path, "run_name=mlflow_case")
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'logs' / 'mlflow.db'}")
    (experiment,) = [e for e in client.search_experiments() if e.name == "tvq_exp"]
    (found,) = client.search_runs([experiment.experiment_id])
    assert found.info.run_name == "mlflow_case"
    assert found.data.params["model.attention.codebook_size"] == "24" and found.data.params["tags"] == TAGS
    assert found.data.metrics["final/val_bpb"] == pytest.approx(result["val"]["bpb"])
    assert found.data.metrics["final/global_step"] == 4
