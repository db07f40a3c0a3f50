"""One source of defaults: a preset under conf/ never repeats its target's constructor default word for word.

Every node of a YAML file under conf/ that names a ``_target_`` is read as written (no composition, no
interpolation) and each of its keys is compared with the default of the same parameter in the target's
signature. A key that restates the default is allowed only in :data:`KEPT`, with the reason it stays.

Not checked here: nodes without ``_target_`` (an experiment's override may restore a default over a preset's
value, which is not a repeat), and ``conf/data/base/*.yaml``, the one place where a data family states the keys
its command lines set (Hydra overrides only keys a preset has; their comment says so).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

from hydra.utils import get_object
from omegaconf import DictConfig, ListConfig, OmegaConf

from tests.helpers.paths import CONF

CLI = "set on a command line, which overrides only keys a preset has"
# (file under conf/, key in that file) -> why it repeats its target's default on purpose
KEPT: dict[tuple[str, str], str] = {
    (
        "callbacks/default.yaml",
        "codebook_health.patience",
    ): f"{CLI} (tests/callbacks/test_codebook_health.py)",
    ("callbacks/default.yaml", "image_samples.num_samples"): f"{CLI} (tests/run/test_quickstart.py)",
    ("callbacks/default.yaml", "image_samples.num_completions"): f"{CLI} (tests/run/test_quickstart.py)",
    ("callbacks/default.yaml", "image_samples.scale"): f"{CLI} (tests/run/test_quickstart.py)",
    # the lead's file at the time of this test; both are repeats to remove when it is next edited
    (
        "experiment/quickstart.yaml",
        "callbacks.image_samples.every_n_validations",
    ): "pending (the lead's file)",
    ("experiment/quickstart.yaml", "callbacks.image_samples.scale"): "pending (the lead's file)",
    # the data location knobs, documented as command lines (docs/images.md, README.md's data table)
    ("data/cifar10.yaml", "source.download"): f"{CLI} (docs/images.md: data.source.download=true)",
    ("data/mnist.yaml", "source.download"): f"{CLI} (docs/images.md: data.source.download=true)",
    ("data/fashion_mnist.yaml", "source.download"): f"{CLI} (docs/images.md: data.source.download=true)",
    (
        "data/imagenet64.yaml",
        "source.val_size",
    ): f"{CLI} (tests/run/test_sweeps.py, tests/data/test_bad_data.py)",
    ("data/gutenberg.yaml", "corpus.path"): f"{CLI} (data.corpus.path=..., README.md's data table)",
    ("data/kjv.yaml", "corpus.path"): f"{CLI} (data.corpus.path=..., README.md's data table)",
    ("data/pg19.yaml", "corpus.path"): f"{CLI} (data.corpus.path=..., README.md's data table)",
    ("data/hf.yaml", "corpus.text_field"): f"{CLI} (the file's own example, docs/scaling.md)",
    ("data/hf.yaml", "corpus.splits"): f"{CLI} (README.md, docs/scaling.md)",
    ("data/hf.yaml", "corpus.holdout"): f"{CLI} (HFTextCorpus's error message names data.corpus.holdout=)",
    (
        "data/text_files.yaml",
        "corpus.split_by",
    ): f"{CLI} (its error message names data.corpus.split_by=bytes)",
    (
        "data/mqar.yaml",
        "task.num_kv_pairs",
    ): f"{CLI} (tests/tools/test_study.py); Zoology's grid pairs it with seq_len",
    ("data/repeat.yaml", "task.distances"): "the file's comment ties the distances to longctx_cpu's L = 128",
    # the block's options: set by the sweeps (conf/sweep/), the docs and tests/run/test_validation.py
    ("model/gau_dense.yaml", "embed_dropout"): CLI,
    ("model/gau_dense.yaml", "block.d_k"): CLI,
    ("model/gau_dense.yaml", "block.heads"): CLI,
    ("model/gau_dense.yaml", "block.position"): CLI,
    ("model/gau_dense.yaml", "block.dropout"): CLI,
    ("model/mha_dense.yaml", "embed_dropout"): CLI,
    ("model/mha_dense.yaml", "block.heads"): CLI,
    ("model/mha_dense.yaml", "block.kv_heads"): CLI,
    ("model/mha_dense.yaml", "block.position"): CLI,
    ("model/mha_dense.yaml", "block.dropout"): CLI,
    ("train.yaml", "module.lr"): f"{CLI}; train.yaml states the recipe's four optimiser keys together",
    # Lightning's Trainer: the keys the docs and tests set (docs/distributed.md, docs/reliability.md, ...)
    ("trainer/default.yaml", "accelerator"): CLI,
    ("trainer/default.yaml", "num_nodes"): f"{CLI} (docs/distributed.md, docs/scaling.md)",
    ("trainer/default.yaml", "limit_val_batches"): f"{CLI}; its comment says null is the reported metric",
    ("trainer/default.yaml", "accumulate_grad_batches"): f"{CLI} (tests/run/test_train.py)",
    ("trainer/default.yaml", "gradient_clip_val"): f"{CLI}: validation refuses it (docs/reliability.md)",
    ("trainer/fsdp.yaml", "strategy.param_dtype"): "docs/scaling.md's table documents the FSDP keys",
    ("trainer/fsdp.yaml", "strategy.reduce_dtype"): "docs/scaling.md's table documents the FSDP keys",
    (
        "trainer/fsdp.yaml",
        "strategy.activation_checkpointing",
    ): "docs/scaling.md's table documents the FSDP keys",
    ("trainer/fsdp.yaml", "strategy.save_distributed_checkpoint"): f"{CLI} (tests/run/test_ddp_train.py)",
}


def signature_defaults(target: str) -> dict[str, Any]:
    """The parameters of ``target`` (a class or function path) that have a default, with it."""
    parameters = inspect.signature(get_object(target)).parameters.values()
    return {p.name: p.default for p in parameters if p.default is not inspect.Parameter.empty}


def same(written: Any, default: Any) -> bool:
    """``written`` (a YAML value) states ``default`` word for word: equal, of the same type."""
    if isinstance(default, tuple):
        default = list(default)
    return type(written) is type(default) and written == default


def repeats(node: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """``(key, value)`` of every key under ``node`` that restates its target's default (keys as dotted paths)."""
    if isinstance(node, ListConfig):
        for index in range(len(node)):
            yield from repeats(node._get_node(index), f"{path}[{index}]")
        return
    if not isinstance(node, DictConfig):
        return
    target = node._get_node("_target_")._value() if "_target_" in node else None
    defaults = signature_defaults(target) if isinstance(target, str) and "${" not in target else {}
    for key in node:
        child = node._get_node(key)
        dotted = f"{path}.{key}" if path else str(key)
        if isinstance(child, DictConfig | ListConfig):
            yield from repeats(child, dotted)
            written = OmegaConf.to_container(child, resolve=False)
        else:
            written = child._value()
        if key in defaults and same(written, defaults[key]):
            yield dotted, written


def preset_files() -> list[str]:
    return sorted(
        str(path.relative_to(CONF)) for path in CONF.rglob("*.yaml") if path.parent != CONF / "data" / "base"
    )


def test_no_preset_repeats_a_constructor_default() -> None:
    found = {
        (name, key): value for name in preset_files() for key, value in repeats(OmegaConf.load(CONF / name))
    }
    repeated = [
        f"conf/{name}: {key}: {value!r}" for (name, key), value in found.items() if (name, key) not in KEPT
    ]
    assert not repeated, (
        "keys that repeat their target's default (delete them, or add them to KEPT with why):\n"
        + ("\n".join(repeated))
    )
    stale = sorted(set(KEPT) - set(found))
    assert not stale, f"KEPT entries that no longer repeat a default (remove them): {stale}"


def test_the_check_sees_a_repeated_default() -> None:
    node = OmegaConf.create(
        {"_target_": "tvq_exp.callbacks.codebook_health.CodebookHealth", "patience": 3, "dead_share": 0.5}
    )
    wrapped = OmegaConf.create({"callback": node, "other": [node]})
    assert list(repeats(wrapped)) == [("callback.patience", 3), ("other[0].patience", 3)]
    assert not same(1, True) and not same(1.0, 1) and same([1, 2], (1, 2))
