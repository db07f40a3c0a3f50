"""Loading a checkpoint never runs code (docs/reliability.md, "Threat model"): real pickle ``__reduce__``
payloads and planted ``_target_``-s, each of which would create a marker file if it ran, given to train (resume
by ``ckpt_path`` and ``resume=auto``, ``init_from``), eval, sample and the FSDP consolidation. Each ends in
one ``error:`` line naming the file, exit status 2, and no marker file."""

from __future__ import annotations

import copy
import os
import pickle
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from hydra import compose, initialize_config_dir
from hydra.utils import get_class
from omegaconf import DictConfig

from tests.helpers.paths import CONF, REPO
from tests.helpers.payloads import Payload
from tests.run.conftest import QUIET, refused
from tvq_exp.run.checkpoints import (
    SHARDED_METADATA,
    CheckpointError,
    UntrustedCheckpointError,
    gather_checkpoint,
    read_checkpoint,
    read_weights,
)
from tvq_exp.run.errors import USAGE_STATUS
from tvq_exp.run.evaluate import evaluate
from tvq_exp.run.fsdp import main as fsdp_main
from tvq_exp.run.sample import sample
from tvq_exp.run.stored import StoredConfigError, stored_run
from tvq_exp.run.train import train

# a foreign class reachable under a tvq_exp name (lightning's CSV writer, imported into tvq_exp.run.loggers):
# constructing it creates its ``log_dir``, so a marker folder shows whether a loader built it
FOREIGN = "tvq_exp.run.loggers.ExperimentWriter"


def _compose(name: str, overrides: list[str]) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(name, overrides=overrides)


def _pickled(good: dict[str, Any], path: Path, marker: Path) -> Path:
    checkpoint = copy.copy(good)
    checkpoint["extra"] = Payload(marker)
    torch.save(checkpoint, path)
    return path


def _planted(good: dict[str, Any], path: Path, marker: Path, where: str) -> Path:
    checkpoint = copy.deepcopy(good)
    config = checkpoint["hyper_parameters"]["run_config"]
    touch = {"_target_": "pathlib.Path.touch", "self": str(marker)}
    if where == "foreign":
        config["model"] = {"_target_": FOREIGN, "log_dir": str(marker)}
    elif where == "model":
        config["model"] = touch
    elif where == "model.block":
        config["model"]["block"] = touch
    elif where == "data":
        config["data"]["corpus"] = touch
    else:
        config["module"]["_target_"] = "pathlib.Path.touch"
    torch.save(checkpoint, path)
    return path


ATTACKS = ["pickle", "model", "model.block", "data", "module", "foreign"]
NAMED = {"pickle": "posix.system", "foreign": FOREIGN}  # what the refusal names (else pathlib.Path.touch)


def test_the_foreign_class_is_reachable_under_tvq_exp_and_makes_its_folder(tmp_path: Path) -> None:
    """The premise of the ``foreign`` attack: hydra resolves the name, the class is not ours, building it acts."""
    found = get_class(FOREIGN)
    assert not found.__module__.startswith("tvq_exp"), found.__module__
    found(log_dir=str(tmp_path / "made"))
    assert (tmp_path / "made").is_dir()


def _attack(good: dict[str, Any], tmp_path: Path, kind: str) -> tuple[Path, Path]:
    marker = tmp_path / "marker"
    path = tmp_path / "evil.ckpt"
    if kind == "pickle":
        return _pickled(good, path, marker), marker
    return _planted(good, path, marker, kind), marker


@pytest.mark.parametrize("kind", ATTACKS)
def test_eval_and_sample_refuse_a_payload_without_running_it(
    good: dict[str, Any], tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path, marker = _attack(good, tmp_path, kind)
    line = refused(capsys, evaluate, _compose("eval", [f"ckpt_path={path}", "accelerator=cpu"]))
    assert str(path) in line and NAMED.get(kind, "pathlib.Path.touch") in line, line
    refused(capsys, sample, _compose("sample", [f"ckpt_path={path}"]))
    assert not marker.exists()


@pytest.mark.parametrize("kind", ATTACKS)
def test_train_refuses_a_payload_to_resume_from(
    good: dict[str, Any], tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path, marker = _attack(good, tmp_path, kind)
    base = ["experiment=smoke", "data=shakespeare", "data.seq_len=64", "trainer.max_steps=4", *QUIET]
    line = refused(
        capsys, train, _compose("train", [*base, f"ckpt_path={path}", f"paths.output_dir={tmp_path}/a"])
    )
    assert str(path) in line
    # resume=auto does not skip over it to an older checkpoint or a fresh start: it stops
    checkpoints = tmp_path / "logs" / "runs" / "r" / "checkpoints"
    checkpoints.mkdir(parents=True)
    path.rename(checkpoints / "last.ckpt")
    auto = [*base, "run_name=r", "resume=auto", f"paths.output_dir={checkpoints.parent}"]
    line = refused(capsys, train, _compose("train", auto))
    assert str(checkpoints / "last.ckpt") in line
    assert not marker.exists() and not (checkpoints.parent / "config.yaml").exists()


def test_init_from_refuses_a_payload_a_foreign_file_and_a_truncated_one(
    good: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    marker = tmp_path / "marker"
    evil = tmp_path / "dense.ckpt"
    torch.save({"state_dict": {"model.x": torch.zeros(1)}, "extra": Payload(marker)}, evil)
    foreign = tmp_path / "foreign.pt"
    torch.save({"weights": [1, 2, 3], "note": "another project's file"}, foreign)
    truncated = tmp_path / "truncated.ckpt"
    torch.save(good, truncated)
    truncated.write_bytes(truncated.read_bytes()[:1000])
    base = ["experiment=smoke", "data=shakespeare", "data.seq_len=64", "trainer.max_steps=2", *QUIET]
    expected = {evil: "posix.system", foreign: "no state dict of tensors", truncated: "truncated or corrupt"}
    for path, why in expected.items():
        cfg = _compose("train", [*base, f"init_from={path}", f"paths.output_dir={tmp_path / path.stem}"])
        line = refused(capsys, train, cfg)
        assert str(path) in line and why in line, line
    # a VQ checkpoint is not a dense one: refused on init_from, naming what does not fit
    vq = tmp_path / "vq.ckpt"
    torch.save(good, vq)
    cfg = _compose("train", [*base, f"init_from={vq}", f"paths.output_dir={tmp_path / 'vq'}"])
    assert "init_from=" in refused(capsys, train, cfg)
    assert not marker.exists()


def _sharded(good: dict[str, Any], folder: Path, meta: dict[str, Any]) -> Path:
    """A sharded checkpoint as ``trainer=fsdp`` writes it (one process, no process group): ``meta.pt`` and the
    weights through ``torch.distributed.checkpoint``."""
    with pytest.warns(UserWarning, match="single process"):
        dcp.save({"state_dict": good["state_dict"]}, checkpoint_id=str(folder), no_dist=True)
    torch.save(meta, folder / SHARDED_METADATA)
    return folder


def test_fsdp_convert_refuses_payloads_a_missing_shard_and_converts_a_good_folder(
    good: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    marker = tmp_path / "marker"
    meta = {k: v for k, v in good.items() if k not in ("state_dict", "optimizer_states")}
    folder = _sharded(good, tmp_path / "good.ckpt", meta)
    gathered = gather_checkpoint(folder)
    assert all(torch.equal(gathered["state_dict"][k], v) for k, v in good["state_dict"].items())

    def convert(source: Path) -> str:
        output = tmp_path / f"{source.name}.single.ckpt"
        with pytest.raises(SystemExit) as exit_info:
            fsdp_main(["convert", str(source), str(output)])
        assert not output.exists()
        return str(exit_info.value.code)

    # a payload in meta.pt, a planted target in meta.pt, a payload as torch's .metadata, a missing shard
    pickled = _sharded(good, tmp_path / "pickled.ckpt", {**meta, "extra": Payload(marker)})
    planted_meta = copy.deepcopy(meta)
    planted_meta["hyper_parameters"]["run_config"]["model"] = {
        "_target_": "pathlib.Path.touch",
        "self": str(marker),
    }
    planted = _sharded(good, tmp_path / "planted.ckpt", planted_meta)
    index = _sharded(good, tmp_path / "index.ckpt", meta)
    (index / ".metadata").write_bytes(
        pickle.dumps(Payload(marker))
    )  # torch.distributed.checkpoint unpickles it
    missing = _sharded(good, tmp_path / "missing.ckpt", meta)
    next(missing.glob("*.distcp")).unlink()
    payload = tmp_path / "bytes.ckpt"  # a pickled item in the shards: torch would load it weights_only=False
    with pytest.warns(UserWarning, match="single process"):
        dcp.save(
            {"state_dict": good["state_dict"], "extra": Payload(marker)},
            checkpoint_id=str(payload),
            no_dist=True,
        )
    torch.save(meta, payload / SHARDED_METADATA)
    expected = {
        pickled: "posix.system",
        planted: "pathlib.Path.touch",
        index: "posix.system",
        missing: "lacks",
        payload: "'extra' as a BytesStorageMetadata item",
    }
    for source, why in expected.items():
        message = convert(source)
        assert message.startswith("error: ") and str(source) in message and why in message, message
        assert "\n" not in message
    assert not marker.exists()
    with pytest.raises(UntrustedCheckpointError):
        read_checkpoint(pickled)


@pytest.mark.parametrize(
    ("key", "target"),
    [
        ("model", "pathlib.Path.touch"),
        ("model", "os.system"),
        ("data.corpus", "tvq_exp.data.paths.Path"),  # a foreign class reachable under a tvq_exp module name
        ("data.corpus", "tvq_exp.run.checkpoints.remove_checkpoint"),  # a function of ours that deletes files
        ("data.corpus", "tvq_exp.run.checkpoints.os.system"),  # a foreign function reached through our module
        ("model.block", "tvq_exp.models.decoder.Decoder"),  # a class of the tree, but not where conf/ puts it
        ("data", "tvq_exp.data.text.hf.HFTextCorpus"),  # a tvq_exp class with side effects (its cache)
        ("module", "tvq_exp.run.loggers.CSVLogger"),  # one that deletes a file when it starts
        ("model", 3),
    ],
)
def test_a_stored_config_picks_only_classes_the_tree_puts_there(
    good: dict[str, Any], key: str, target: Any
) -> None:
    config = copy.deepcopy(good["hyper_parameters"]["run_config"])
    node = config
    for part in key.split("."):
        node = node[part]
    node["_target_"] = target
    with pytest.raises(StoredConfigError, match=rf"{key}\._target_=.*conf/ puts at {key}"):
        stored_run(config, "x.ckpt")
    anywhere = copy.deepcopy(good["hyper_parameters"]["run_config"])
    anywhere["model"]["block"]["extra"] = {
        "_target_": "tvq_exp.models.decoder.Decoder"
    }  # a class of the tree
    with pytest.raises(StoredConfigError, match=r"model\.block\.extra\._target_=.*conf/ puts no class there"):
        stored_run(anywhere, "x.ckpt")


@pytest.mark.parametrize(
    ("key", "value", "why"),
    [
        ("model.d_model", "${oc.env:HOME}", "interpolation or resolver"),
        (
            "data.corpus.path",
            "${oc.create:{_target_: os.makedirs, name: /tmp/x}}",
            "interpolation or resolver",
        ),
        ("module.lr", float("nan"), "finite number"),
        ("module.betas", [0.9, object()], "a stored value is null"),
        ("model.block._args_", ["x"], "_args_"),
        ("model.block._partial_", False, "conf/ sets _partial_=True"),
        ("model.attention.codebook._recursive_", False, "Hydra keys stand only beside a _target_"),
    ],
)
def test_a_stored_value_is_a_literal(good: dict[str, Any], key: str, value: Any, why: str) -> None:
    config = copy.deepcopy(good["hyper_parameters"]["run_config"])
    *parents, leaf = key.split(".")
    node = config
    for part in parents:
        node = node[part]
    node[leaf] = value
    with pytest.raises(StoredConfigError, match=re.escape(why)) as error:
        stored_run(config, "x.ckpt")
    assert str(error.value).startswith("x.ckpt: ") and "\n" not in str(error.value)


def test_the_rebuilt_run_is_the_stored_one(good: dict[str, Any]) -> None:
    config = good["hyper_parameters"]["run_config"]
    rebuilt = stored_run(config, "x.ckpt")
    assert set(rebuilt) == {"model", "data", "module", "seed"}  # never the trainer, callbacks or loggers
    assert {k: rebuilt[k] for k in ("model", "data", "module")} == {
        k: config[k] for k in ("model", "data", "module")
    }


def test_a_torch_file_from_another_project_is_not_a_checkpoint(tmp_path: Path) -> None:
    foreign = tmp_path / "other.ckpt"
    torch.save({"state_dict": {"w": torch.ones(2)}, "global_step": 3}, foreign)  # no run config
    with pytest.raises(
        CheckpointError, match="not a tvq_exp training checkpoint .no hyper_parameters.run_config"
    ):
        read_checkpoint(foreign)
    assert set(read_weights(foreign)["state_dict"]) == {"w"}


def test_eval_py_refuses_a_payload_in_one_line(good: dict[str, Any], tmp_path: Path) -> None:
    """The issue's report, end to end: ``eval.py`` on a checkpoint whose pickle runs a shell command."""
    path, marker = _attack(good, tmp_path, "pickle")
    proc = subprocess.run(
        [sys.executable, str(REPO / "eval.py"), f"ckpt_path={path}", "accelerator=cpu"],
        cwd=tmp_path,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == USAGE_STATUS, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"error: checkpoint {path} names posix.system, which a checkpoint of tvq_exp never holds; refused "
        "without running it (load only checkpoints from people you trust)"
    ]
    assert not marker.exists()
