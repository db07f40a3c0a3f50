"""A stored run config is data: what a checkpoint (or a run dir's ``config.yaml``) may say about the run it holds,
and how the run is rebuilt from the project's own config tree.

A checkpoint stores its resolved run config (``hyper_parameters.run_config``). Of it, :func:`stored_run` keeps the
parts that must match the weights, the optimiser and the sampler state (:data:`STORED_PARTS`: ``model``, ``data``,
``module``, ``seed``) and checks that they are plain data the tree could have composed:

* every value is ``None``, a bool, a number, a string, or a list or mapping of those; every string is a literal
  (an interpolation or resolver, ``${...}``, is refused: OmegaConf would run it when the value is read);
* a ``_target_`` stands only where ``conf/`` puts one (``model``, ``model.block``, ``model.attention``,
  ``model.pos_embedding``, ``data``, ``data.corpus`` / ``task`` / ``source``, ``module``), and names one of the
  classes ``conf/`` names there (:func:`tree_targets`, read from the YAML files of ``conf/``, never from the
  file); its Hydra flags (``_partial_``) are the tree's; no other Hydra key (``_args_``, ``_recursive_``, ...).

The result names nothing the tree does not name: the stored string is only the key that picks one of the tree's
classes, and nothing is imported or built from the file itself (:class:`StoredConfigError` otherwise, one line
naming the key). Options are then validated by the same schema as the command line
(:func:`tvq_exp.run.validation.check_parts`) before anything is built. The trainer, callbacks and loggers are
never taken from a file (:mod:`tvq_exp.run.compose`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from tvq_exp.run.legacy import upgrade_run_config

CONF = Path(__file__).resolve().parents[2] / "conf"
STORED_PARTS = ("model", "data", "module")  # the nodes a run is rebuilt from (plus the seed)
HYDRA_KEYS = frozenset({"_target_", "_partial_", "_recursive_", "_convert_", "_args_"})
# conf/ folders whose YAML files are the stored parts, and the config key each file's content lands on
TREE_PACKAGES = {
    "model": "model",
    "model/attention": "model.attention",
    "model/pos_embedding": "model.pos_embedding",
    "data": "data",
    "data/base": "data",
}
INTERPOLATION = "${"


class StoredConfigError(ValueError):
    """A stored run config that is more than data the tree could have composed (one line naming the key)."""


@functools.cache
def tree_targets() -> dict[str, dict[str, dict[str, Any]]]:
    """``{config key: {target: its Hydra flags}}`` for every ``_target_`` that ``conf/`` puts in a stored part
    (``{"model.block": {"tvq_exp.models.blocks.GAUBlock": {"_partial_": True}, ...}, ...}``), read from the YAML
    files (the tree's own, never a stored file's)."""
    found: dict[str, dict[str, dict[str, Any]]] = {}
    for folder, package in TREE_PACKAGES.items():
        for path in sorted((CONF / folder).glob("*.yaml")):
            text = path.read_text()
            if "@package _global_" in text:
                continue
            _collect(yaml.safe_load(text) or {}, package, found)
    train = yaml.safe_load((CONF / "train.yaml").read_text())
    _collect(train["module"], "module", found)
    return found


def _collect(node: Any, key: str, found: dict[str, dict[str, dict[str, Any]]]) -> None:
    if not isinstance(node, Mapping):
        return
    if isinstance(node.get("_target_"), str):
        flags = {k: v for k, v in node.items() if k in HYDRA_KEYS and k != "_target_"}
        found.setdefault(key, {})[node["_target_"]] = flags
    for name, child in node.items():
        if name != "defaults":
            _collect(child, f"{key}.{name}", found)


def stored_run(config: Any, source: str) -> dict[str, Any]:
    """The parts of the stored run config ``config`` that a run is rebuilt from (:data:`STORED_PARTS` and
    ``seed``), upgraded to the current layout (:mod:`tvq_exp.run.legacy`) and checked as data (module doc);
    :class:`StoredConfigError` naming ``source`` (the file) and the key otherwise."""
    if not isinstance(config, Mapping):
        raise StoredConfigError(f"{source}: its run config is not a mapping ({type(config).__name__})")
    missing = [part for part in STORED_PARTS if not isinstance(config.get(part), Mapping)]
    if missing:
        raise StoredConfigError(f"{source}: its run config has no {', '.join(missing)} (not a tvq_exp run)")
    try:
        for key, value in _leaves({part: config[part] for part in (*STORED_PARTS, "seed") if part in config}):
            _check_literal(key, value)
        upgraded = upgrade_run_config({part: config[part] for part in STORED_PARTS})
        rebuilt = {part: _rebuilt(upgraded[part], part) for part in STORED_PARTS}
    except StoredConfigError as error:
        raise StoredConfigError(f"{source}: {error}") from None
    seed = config.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise StoredConfigError(f"{source}: its run config has seed={seed!r}: must be a non-negative integer")
    return {**rebuilt, "seed": seed}


def _leaves(node: Any, key: str = "") -> Iterator[tuple[str, Any]]:
    """Every ``(key, value)`` below ``node``, mapping keys included as values of ``<key>.<name>`` (depth first)."""
    if isinstance(node, Mapping):
        for name, child in node.items():
            if not isinstance(name, str):
                raise StoredConfigError(
                    f"its run config has a key {name!r} below {key or 'the top'}: keys are names"
                )
            yield from _leaves(child, f"{key}.{name}" if key else name)
    elif isinstance(node, (list, tuple)):
        for i, child in enumerate(node):
            yield from _leaves(child, f"{key}[{i}]")
    else:
        yield key, node


def _check_literal(key: str, value: Any) -> None:
    if value is None or isinstance(value, (bool, int, str)):
        if isinstance(value, str) and INTERPOLATION in value:
            raise StoredConfigError(
                f"its run config has {key}={value!r}: a stored value is a literal, and an interpolation or "
                "resolver (${...}) is refused (nothing was resolved)"
            )
        return
    if isinstance(value, float) and math.isfinite(value):
        return
    shown = value if isinstance(value, float) else type(value).__name__
    raise StoredConfigError(
        f"its run config has {key}={shown!r}: a stored value is null, a bool, a finite number or a string"
    )


def _rebuilt(node: Any, key: str) -> Any:
    """``node`` with every ``_target_`` and Hydra flag taken from :func:`tree_targets` at ``key``."""
    if isinstance(node, (list, tuple)):
        return [_rebuilt(child, f"{key}[{i}]") for i, child in enumerate(node)]
    if not isinstance(node, Mapping):
        return node
    flags = sorted(set(node) & HYDRA_KEYS)
    if "_target_" not in node and flags:
        raise StoredConfigError(
            f"its run config has {key}.{flags[0]}: Hydra keys stand only beside a _target_"
        )
    plain = {name: _rebuilt(child, f"{key}.{name}") for name, child in node.items() if name not in HYDRA_KEYS}
    if "_target_" not in node:
        return plain
    known = tree_targets().get(key, {})
    target = node["_target_"]
    if target not in known:
        where = f"conf/ names {', '.join(sorted(known))}" if known else "conf/ puts no class there"
        raise StoredConfigError(
            f"its run config has {key}._target_={target!r}: a stored config may only pick a class that conf/ "
            f"puts at {key} ({where}); refused, nothing was imported or built"
        )
    tree_flags = known[target]
    for flag in flags:
        if flag != "_target_" and node[flag] != tree_flags.get(flag):
            raise StoredConfigError(
                f"its run config has {key}.{flag}={node[flag]!r}: conf/ sets "
                f"{flag}={tree_flags.get(flag)!r} for {target}; refused"
            )
    return {"_target_": target, **tree_flags, **plain}


def read_run_dir_config(run_dir: str | Path) -> dict[str, Any]:
    """The stored parts of the run config a run dir holds (``config.yaml``, read with ``yaml.safe_load``: no
    Python tags), checked as :func:`stored_run` checks a checkpoint's."""
    path = Path(run_dir) / "config.yaml"
    try:
        config = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise StoredConfigError(f"{path} cannot be read as plain YAML ({first})") from None
    return stored_run(config, str(path))


__all__ = ["STORED_PARTS", "StoredConfigError", "read_run_dir_config", "stored_run", "tree_targets"]
