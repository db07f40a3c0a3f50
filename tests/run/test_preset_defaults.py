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
from omegaconf import OmegaConf

from tests.helpers.paths import CONF
from tvq_exp.options import option_functions

# Keys that repeat their target's default on purpose: why -> {file under conf/: the keys in it}. Hydra overrides
# only keys a preset has (`key=value`; a missing one needs `+key=value`), so a key the command line sets stays.
KEPT: dict[str, dict[str, tuple[str, ...]]] = {
    "set on a command line by the tests (test_codebook_health, test_quickstart, test_train, test_ddp_train, "
    "test_sweeps, test_bad_data, test_study, test_validation) and the sweeps": {
        "callbacks/default.yaml": (
            "codebook_health.patience", "image_samples.num_samples", "image_samples.num_completions",
            "image_samples.scale",
        ),
        "data/imagenet64.yaml": ("source.val_size",),
        "data/mqar.yaml": ("task.num_kv_pairs",),
        "model/gau_dense.yaml": ("embed_dropout", "block.d_k", "block.heads", "block.position", "block.dropout"),
        "model/mha_dense.yaml": ("embed_dropout", "block.heads", "block.kv_heads", "block.position", "block.dropout"),
        "train.yaml": ("module.lr",),
        "trainer/default.yaml": ("accelerator", "accumulate_grad_batches", "limit_val_batches"),
        "trainer/fsdp.yaml": ("strategy.save_distributed_checkpoint",),
    },
    "set on a command line that the docs (README.md, docs/*.md) or an error message print": {
        "data/cifar10.yaml": ("source.download",),
        "data/mnist.yaml": ("source.download",),
        "data/fashion_mnist.yaml": ("source.download",),
        "data/gutenberg.yaml": ("corpus.path",),
        "data/kjv.yaml": ("corpus.path",),
        "data/pg19.yaml": ("corpus.path",),
        "data/hf.yaml": ("corpus.text_field", "corpus.splits", "corpus.holdout"),
        "data/text_files.yaml": ("corpus.split_by",),
        "data/repeat.yaml": ("task.span_content",),
        "trainer/default.yaml": ("num_nodes", "gradient_clip_val"),
    },
    "docs/scaling.md's table documents the FSDP keys with these values": {
        "trainer/fsdp.yaml": ("strategy.param_dtype", "strategy.reduce_dtype", "strategy.activation_checkpointing"),
    },
    "set on a command line by make bench-gpu's training section (tvq_exp/tools/bench/gpu_training.py) and "
    "test_bench_gpu": {"debug/device_profile.yaml": tuple(f"callbacks.device_profile.{k}" for k in ("skip", "steps", "rows"))},
    "the file's comment ties the distances to longctx_cpu's L = 128": {"data/repeat.yaml": ("task.distances",)},
}  # fmt: skip
ALLOWED = {(name, key) for files in KEPT.values() for name, keys in files.items() for key in keys}


def signature_defaults(target: str) -> dict[str, Any]:
    """The parameters of ``target`` (a class or function path) that have a default, with it: its constructor's
    and those of the base classes it hands its ``**options`` to (:func:`tvq_exp.options.option_functions`)."""
    defaults: dict[str, Any] = {}
    for function in reversed(option_functions(get_object(target))):
        for p in inspect.signature(function).parameters.values():
            if p.default is not inspect.Parameter.empty:
                defaults[p.name] = p.default
    return defaults


def same(written: Any, default: Any) -> bool:
    """``written`` (a YAML value) states ``default`` word for word: equal, of the same type."""
    if isinstance(default, tuple):
        default = list(default)
    return type(written) is type(default) and written == default


def repeats(node: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """``(key, value)`` of every key under ``node`` (a YAML file as plain containers, interpolations unresolved)
    that restates its target's default; keys as dotted paths."""
    children = enumerate(node) if isinstance(node, list) else node.items() if isinstance(node, dict) else ()
    target = node.get("_target_") if isinstance(node, dict) else None
    defaults = signature_defaults(target) if isinstance(target, str) and "${" not in target else {}
    for key, child in children:
        dotted = f"{path}[{key}]" if isinstance(node, list) else f"{path}.{key}" if path else str(key)
        yield from repeats(child, dotted)
        if key in defaults and same(child, defaults[key]):
            yield dotted, child


def preset_files() -> list[str]:
    return sorted(
        str(path.relative_to(CONF)) for path in CONF.rglob("*.yaml") if path.parent != CONF / "data" / "base"
    )


def load(name: str) -> Any:
    """``conf/<name>`` as written: plain containers, interpolations unresolved."""
    return OmegaConf.to_container(OmegaConf.load(CONF / name), resolve=False)


def test_no_preset_repeats_a_constructor_default() -> None:
    found = {(name, key): value for name in preset_files() for key, value in repeats(load(name))}
    repeated = [
        f"conf/{name}: {key}: {value!r}" for (name, key), value in found.items() if (name, key) not in ALLOWED
    ]
    assert not repeated, (
        "keys that repeat their target's default (delete them, or add them to KEPT under why they stay):\n"
        + ("\n".join(repeated))
    )
    stale = sorted(ALLOWED - set(found))
    assert not stale, f"KEPT entries that no longer repeat a default (remove them): {stale}"


def test_the_check_sees_a_repeated_default() -> None:
    node = {"_target_": "tvq_exp.callbacks.codebook_health.CodebookHealth", "patience": 3, "dead_share": 0.5}
    assert list(repeats({"callback": node, "other": [node]})) == [
        ("callback.patience", 3),
        ("other[0].patience", 3),
    ]
    assert not same(1, True) and not same(1.0, 1) and same([1, 2], (1, 2))
