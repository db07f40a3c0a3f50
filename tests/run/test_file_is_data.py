"""A file is data, never code (docs/reliability.md, "Threat model"): a payload that would create a marker folder if
it ever ran, planted in each reader's path (a resolver in a checkpoint's stored config, a stored trainer, callback
or logger, a bytes item in a sharded checkpoint, a run dir's ``config.yaml``, a pickle given to the scripts under
``tools/``). Each command ends in one ``error:`` line naming the file (or, for the stored trainer, never reads
it), and the marker never appears."""

from __future__ import annotations

import copy
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from tests.helpers.paths import CONF, REPO
from tests.helpers.payloads import Payload, makedirs_node, makedirs_resolver
from tests.run.conftest import QUIET, refused
from tvq_exp.run.evaluate import evaluate
from tvq_exp.run.fsdp import main as fsdp_main
from tvq_exp.run.sample import sample
from tvq_exp.run.train import train

BASE = ["experiment=smoke", "data=shakespeare", "data.seq_len=64", *QUIET]


def _compose(name: str, overrides: list[str]) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(name, overrides=overrides)


def _tool(name: str) -> ModuleType:
    path = REPO / "tools" / "cache_diagnosis" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(REPO))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(REPO))
    return module


RESOLVER_KEYS = ["model.attention.kernel", "data.corpus.path", "module.lr", "model.block.dropout"]


def _with_resolver(good: dict[str, Any], key: str, marker: Path) -> dict[str, Any]:
    checkpoint = copy.deepcopy(good)
    node = checkpoint["hyper_parameters"]["run_config"]
    *parents, leaf = key.split(".")
    for part in parents:
        node = node[part]
    node[leaf] = makedirs_resolver(marker)
    return checkpoint


@pytest.mark.parametrize("key", RESOLVER_KEYS)
def test_a_resolver_in_a_stored_config_is_refused_by_every_reader(
    good: dict[str, Any], tmp_path: Path, key: str, capsys: pytest.CaptureFixture[str]
) -> None:
    marker = tmp_path / "marker"
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    path = run / "checkpoints" / "last.ckpt"
    torch.save(_with_resolver(good, key, marker), path)
    for line in (
        refused(capsys, evaluate, _compose("eval", [f"ckpt_path={path}", "accelerator=cpu"])),
        refused(capsys, sample, _compose("sample", [f"ckpt_path={path}", "num_bytes=4"])),
        refused(capsys, train, _compose("train", [*BASE, f"ckpt_path={path}", f"paths.output_dir={run}"])),
        refused(
            capsys, train, _compose("train", [*BASE, "run_name=r", "resume=auto", f"paths.output_dir={run}"])
        ),
        refused(
            capsys,
            train,
            _compose("train", [*BASE, f"init_from={path}", f"paths.output_dir={tmp_path / 'i'}"]),
        ),
    ):
        assert str(path) in line and "interpolation or resolver" in line and key in line, line
    for tool in ("code_norms", "copy_codes"):
        with pytest.raises(Exception, match="interpolation or resolver"):
            getattr(_tool(tool), "trained_model" if tool == "code_norms" else "trained_run")(run)
    assert not marker.exists()


@pytest.mark.parametrize("part", ["trainer.profiler", "callbacks.evil", "logger.evil"])
def test_a_continued_run_never_builds_the_stored_trainer_callbacks_or_loggers(
    good: dict[str, Any], tmp_path: Path, part: str
) -> None:
    """The stored config's trainer, callbacks and loggers are not read at all: the tree and the command line
    give them (``trainer.max_steps`` equal to the checkpoint's step: nothing is trained, the run is composed,
    validated and its stored parts rebuilt)."""
    marker = tmp_path / "marker"
    checkpoint = copy.deepcopy(good)
    parent, leaf = part.split(".")
    checkpoint["hyper_parameters"]["run_config"][parent][leaf] = makedirs_node(marker)
    path = tmp_path / "planted.ckpt"
    torch.save(checkpoint, path)
    cfg = _compose(
        "train", [*BASE, f"ckpt_path={path}", "trainer.max_steps=3", f"paths.output_dir={tmp_path}/o"]
    )
    assert train(cfg, overrides=["trainer.max_steps=3"])["global_step"] == 3
    assert not marker.exists()


def test_a_bytes_item_in_a_sharded_checkpoint_refuses_it_before_any_shard_is_read(
    good: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    marker = tmp_path / "marker"
    folder = tmp_path / "sharded.ckpt"
    with pytest.warns(UserWarning, match="single process"):
        dcp.save(
            {"state_dict": good["state_dict"], "extra": Payload(marker)},
            checkpoint_id=str(folder),
            no_dist=True,
        )
    torch.save(
        {k: v for k, v in good.items() if k not in ("state_dict", "optimizer_states")}, folder / "meta.pt"
    )
    lines = [
        refused(capsys, evaluate, _compose("eval", [f"ckpt_path={folder}", "accelerator=cpu"])),
        refused(capsys, sample, _compose("sample", [f"ckpt_path={folder}", "num_bytes=4"])),
        refused(
            capsys, train, _compose("train", [*BASE, f"ckpt_path={folder}", f"paths.output_dir={tmp_path}/o"])
        ),
    ]
    with pytest.raises(SystemExit) as exit_info:
        fsdp_main(["convert", str(folder), str(tmp_path / "single.ckpt")])
    lines.append(str(exit_info.value.code))
    for line in lines:
        assert line.startswith(f"error: sharded checkpoint {folder}: ") and "'extra'" in line, line
    assert not marker.exists() and not (tmp_path / "single.ckpt").exists()


@pytest.mark.parametrize(
    "text",
    [
        "model: !!python/object/apply:os.makedirs ['{marker}']\n",
        "model: {{_target_: os.makedirs, name: '{marker}'}}\ndata: {{}}\nmodule: {{}}\n",
    ],
)
def test_the_tools_never_build_a_run_dirs_config(good_run: Path, tmp_path: Path, text: str) -> None:
    """``tools/cache_diagnosis`` rebuilds a run from its checkpoint's stored run (checked as data), never from
    ``config.yaml``: a payload there is never read, and :func:`read_run_dir_config` refuses it in one line."""
    from tvq_exp.run.stored import StoredConfigError, read_run_dir_config

    marker = tmp_path / "marker"
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "last.ckpt").write_bytes((good_run / "checkpoints" / "last.ckpt").read_bytes())
    (run / "config.yaml").write_text(text.format(marker=marker))
    _, config = _tool("code_norms").trained_model(run)
    assert config["model"]["_target_"] == "tvq_exp.models.decoder.Decoder"  # the checkpoint's stored run
    with pytest.raises(StoredConfigError) as error:
        read_run_dir_config(run)
    assert str(run / "config.yaml") in str(error.value) and "\n" not in str(error.value)
    assert not marker.exists()


def test_the_mqar_probes_read_a_checkpoint_with_the_safe_loader(tmp_path: Path) -> None:
    sys.path.insert(0, str(REPO))
    try:
        from tools.mqar_diagnosis.common import recall_model
    finally:
        sys.path.remove(str(REPO))
    from tvq_exp.run.checkpoints import CheckpointError

    marker = tmp_path / "marker"
    path = tmp_path / "evil.ckpt"
    torch.save({"state_dict": {"model.x": torch.zeros(1)}, "extra": Payload(marker)}, path)
    with pytest.raises(CheckpointError, match="posix.system"):
        recall_model([], str(path))
    assert not marker.exists()
