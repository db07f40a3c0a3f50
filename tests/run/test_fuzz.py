"""Fuzzing the config schema: bad overrides drawn from the schema itself, for every config area, each refused with
one ``ConfigError`` line that names the key (docs/reliability.md, "Bad input").

The cases come from the same annotations that validation reads (:func:`tvq_exp.options.constraints`,
:func:`tvq_exp.run.validation.schema_for`): every range or choice rule gives its out-of-range values, every typed
number or flag a value of the wrong type, every area an unknown key. A seeded sample of them runs here.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf

from tests.helpers.paths import CONF
from tvq_exp.options import constraints
from tvq_exp.run import schema
from tvq_exp.run.validation import Command, ConfigError, data_nodes, model_nodes, schema_for, validate

PER_AREA = 14  # cases drawn per area (every case of an area with fewer)
WRONG_TYPE = {int: "abc", float: "abc", bool: "maybe"}


def _compose(name: str, overrides: list[str]) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(name, overrides=overrides)


BASE = {"train": ["experiment=smoke"], "eval": ["ckpt_path=x.ckpt"], "sample": ["ckpt_path=x.ckpt"]}


def _areas() -> list[tuple[str, str, Callable[..., Any]]]:
    """(command, key prefix, the signature that is the area's schema) for every config area."""
    cfg = _compose("train", BASE["train"])
    targets = [(node.key, node.target) for node in model_nodes(cfg.model) + data_nodes(cfg.data)]
    module = __import__("tvq_exp.models.module", fromlist=["AutoregressiveLitModule"]).AutoregressiveLitModule
    return [
        *(("train", key, target) for key, target in targets),
        ("train", "module", module),
        ("train", "", schema.train_options),
        ("train", "trainer", schema.trainer_options),
        ("train", "guard", schema.guard_options),
        ("eval", "", schema.eval_options),
        ("sample", "", schema.sample_options),
    ]


def _raw(cfg: DictConfig, key: str) -> Any:
    """The value at ``key`` as written (interpolations unresolved)."""
    node: Any = OmegaConf.to_container(cfg, resolve=False)
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def _key(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _cases() -> list[tuple[str, str, str]]:
    """(command, override, the key its refusal must name), a seeded sample per area."""
    skip = {"model", "run_config", "block", "attention", "pos_embedding", "codebook", "corpus", "source"}
    rng = random.Random(0)
    cases: list[tuple[str, str, str]] = []
    for command, prefix, target in _areas():
        area = []
        for name, rule in constraints(target).items():
            area += [
                (command, f"++{_key(prefix, name)}={value}", _key(prefix, name))
                for value in rule.bad_values()
            ]
        for name, field in schema_for(target).__dataclass_fields__.items():
            if field.type in WRONG_TYPE and name not in skip:
                area.append((command, f"++{_key(prefix, name)}={WRONG_TYPE[field.type]}", _key(prefix, name)))
        area.append((command, f"++{_key(prefix, 'no_such_option')}=1", _key(prefix, "no_such_option")))
        cases += rng.sample(area, min(PER_AREA, len(area)))
    return cases


CASES = _cases()


def test_every_area_is_fuzzed() -> None:
    prefixes = {override.split("=")[0].lstrip("+").rsplit(".", 1)[0] for _, override, _ in CASES}
    assert {"model", "model.block", "model.attention", "data", "module", "trainer", "guard"} <= prefixes
    assert {command for command, _, _ in CASES} == {"train", "eval", "sample"}
    assert len(CASES) >= 130


@pytest.mark.parametrize(("command", "override", "key"), CASES, ids=[f"{c}:{o}" for c, o, _ in CASES])
def test_a_bad_override_is_one_line_naming_its_key(command: str, override: str, key: str) -> None:
    cfg = _compose(command, [*BASE[command], override])
    with pytest.raises(ConfigError) as error:
        validate(cfg, Command(command))
    message = str(error.value)
    named = error.value.key
    # a key whose value is an interpolation of the bad key (model.vocab_size: ${data.vocab_size}) names it too
    assert named == key or _raw(cfg, named) == f"${{{key}}}", message
    assert "\n" not in message and len(message) < 400, message
