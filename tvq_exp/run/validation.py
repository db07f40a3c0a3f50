"""Validation of a composed Hydra config, before any data is loaded or any model is built.

Two layers:
1. **Structured schemas.** For each node with a ``_target_`` (the model, its block, attention and
   codebook, the data module and its corpus), a dataclass is generated from the target's
   constructor signature and the node is merged into it with OmegaConf: unknown keys (typos) and
   values of the wrong type are refused with the full key.
2. **Cross-field rules** (ranges, divisibility, backend/option combinations).

Every failure is a :class:`ConfigError` whose one-line message names the key, the bad value and
what is allowed.
"""

from __future__ import annotations

import dataclasses
import inspect
import types
import typing
from collections.abc import Callable
from typing import Any

from hydra.utils import get_method, get_object
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from tvq_exp.attention import BACKENDS
from tvq_exp.quantize.codebook import VectorQuantizer

HYDRA_KEYS = {"_target_", "_partial_", "_recursive_", "_convert_", "_args_"}
SIMPLE_TYPES = (int, float, bool, str)


class ConfigError(ValueError):
    """A config value that is not allowed; ``str(err)`` is ``"<key>=<value>: <what is allowed>"``."""

    def __init__(self, key: str, value: Any, allowed: str) -> None:
        self.key, self.value, self.allowed = key, value, allowed
        super().__init__(f"{key}={value!r}: {allowed}")


# --------------------------------------------------------------------------------------- schemas
def _field_type(annotation: Any) -> Any:
    """Map a constructor annotation to a type OmegaConf can check (``Any`` when it cannot)."""
    if annotation in SIMPLE_TYPES:
        return annotation
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return typing.Optional[rest[0]] if len(rest) == 1 and rest[0] in SIMPLE_TYPES else Any  # noqa: UP045
    if typing.get_origin(annotation) is typing.Literal:
        return str if all(isinstance(a, str) for a in args) else Any
    return Any


def schema_for(target: Callable[..., Any], skip: set[str] = frozenset()) -> type:
    """A dataclass with one field per keyword argument of ``target`` (``**kwargs`` targets: None)."""
    fn = target.__init__ if inspect.isclass(target) else target
    hints = typing.get_type_hints(fn)
    fields = []
    for name, p in inspect.signature(fn).parameters.items():
        if name in ("self", *skip) or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        default = dataclasses.MISSING if p.default is p.empty else p.default
        if isinstance(default, (list, dict, tuple)) or (default is not dataclasses.MISSING and not isinstance(default, (*SIMPLE_TYPES, type(None)))):
            default = None
        typ = _field_type(hints.get(name, Any))
        fields.append((name, typ, dataclasses.field(default=default)) if default is not dataclasses.MISSING else (name, typ))
    fields.sort(key=lambda f: len(f) == 3)  # required fields first
    return dataclasses.make_dataclass(f"{getattr(target, '__name__', 'Target')}Config", fields)


def check_node(node: DictConfig, key: str, target: Callable[..., Any], skip: set[str] = frozenset(), nested: set[str] = frozenset()) -> None:
    """Type-check ``node`` against ``target``'s signature; ``nested`` keys are checked separately."""
    schema = OmegaConf.structured(schema_for(target, skip | nested))
    plain = {k: v for k, v in node.items() if k not in HYDRA_KEYS | nested}
    allowed = sorted(set(schema.keys()))
    for name in plain:
        if name not in allowed:
            raise ConfigError(f"{key}.{name}", plain[name], f"unknown option for {_name(target)}; allowed: {', '.join(allowed)}")
    try:
        OmegaConf.merge(schema, OmegaConf.create(plain))
    except OmegaConfBaseException as err:
        bad = str(getattr(err, "full_key", "") or err).split("\n")[0]
        name = bad if bad in plain else next((n for n in plain if n in str(err)), bad)
        expected = schema_for(target, skip | nested).__dataclass_fields__.get(name)
        kind = getattr(expected.type, "__name__", str(expected.type)) if expected else "a valid value"
        raise ConfigError(f"{key}.{name}", plain.get(name), f"must be of type {kind}") from None
    for name in schema.keys():
        if OmegaConf.is_missing(schema, name) and name not in plain:
            raise ConfigError(f"{key}.{name}", "???", f"required by {_name(target)}")


def _name(target: Any) -> str:
    return getattr(target, "__qualname__", str(target))


def _target(node: DictConfig, key: str) -> Any:
    path = node.get("_target_")
    if not path:
        raise ConfigError(f"{key}._target_", path, "a dotted path to a class or function is required")
    try:
        return get_object(path) if "." in path else get_method(path)
    except Exception:  # noqa: BLE001 - any import failure means the path is wrong
        raise ConfigError(f"{key}._target_", path, "cannot be imported; check the dotted path") from None


# ---------------------------------------------------------------------------------------- rules
def _require(cond: bool, key: str, value: Any, allowed: str) -> None:
    if not cond:
        raise ConfigError(key, value, allowed)


def _positive_int(node: DictConfig, key: str, name: str, required: bool = True) -> None:
    value = node.get(name)
    if value is None and not required:
        return
    _require(isinstance(value, int) and not isinstance(value, bool) and value >= 1, f"{key}.{name}", value, "must be a positive integer")


def _fraction(node: DictConfig, key: str, name: str) -> None:
    value = node.get(name, 0.0)
    _require(isinstance(value, (int, float)) and 0.0 <= value < 1.0, f"{key}.{name}", value, "must be in [0, 1)")


def check_attention(att: DictConfig, block: DictConfig, key: str = "model.attention") -> str:
    """Check the attention node; returns the backend name."""
    name = att.get("name")
    _require(name in BACKENDS, f"{key}.name", name, f"unknown backend; choose one of {', '.join(sorted(BACKENDS))}")
    check_node(att, key, BACKENDS[name], skip={"d_k", "d_v", "heads", "kv_heads", "window_bias"}, nested={"name", "codebook"})
    if att.get("codebook") is not None:
        check_codebook(att.codebook, name, f"{key}.codebook")
    position = block.get("position", "xl")
    if name == "vq":
        _positive_int(att, key, "block_len")
        _require(isinstance(att.get("codebook_size"), int) and att.codebook_size >= 2, f"{key}.codebook_size", att.get("codebook_size"), "must be an integer >= 2")
        window = att.get("window_len")
        _require(window is None or (isinstance(window, int) and 0 <= window <= att.block_len), f"{key}.window_len", window, f"must be null or in [0, block_len={att.block_len}]")
    if position == "xl" and "window_len" in att and name != "vq":  # dense needs a window; others default it
        _positive_int(att, key, "window_len", required=name == "dense")
    if position == "xl" and not BACKENDS[name].supports_window_bias:
        raise ConfigError("model.block.position", position, f"the {name} backend has no relative bias; use rope or none")
    for opt in ("talking_heads", "talking_heads_post"):
        if block.get(opt) or att.get(opt):
            _require(name == "dense", f"model.block.{opt}", True, f"talking heads mix dense logits; not possible with the {name} backend (use model/attention=dense)")
    return name


def check_block(block: DictConfig, d_model: int, key: str = "model.block") -> None:
    target = _target(block, key)
    check_node(block, key, target, skip={"d_model", "attention"})
    _require(block.get("position", "xl") in ("xl", "rope", "none"), f"{key}.position", block.get("position"), "must be one of xl, rope, none")
    _fraction(block, key, "dropout")
    _fraction(block, key, "layerdrop")
    heads = block.get("heads", 1)
    _positive_int(block, key, "heads")
    _positive_int(block, key, "kv_heads", required=False)
    kv = block.get("kv_heads") or heads
    _require(heads % kv == 0, f"{key}.kv_heads", block.get("kv_heads"), f"must divide heads={heads}")
    if "d_k" in block:
        _positive_int(block, key, "d_k")
    if "expansion" in block:
        _positive_int(block, key, "expansion")
        _require(block.expansion * d_model % heads == 0, f"{key}.heads", heads, f"must divide expansion*d_model={block.expansion * d_model}")
    if "head_size" in block and block.get("head_size") is None:
        _require(d_model % heads == 0, f"{key}.heads", heads, f"must divide d_model={d_model} (or set head_size)")
    for name in ("head_size", "key_size"):
        _positive_int(block, key, name, required=False)


def check_codebook(codebook: DictConfig, backend: str, key: str = "model.attention.codebook") -> None:
    _require(backend == "vq", key, "...", f"codebook options only apply to the vq backend, not {backend} (drop model/attention/codebook)")
    check_node(codebook, key, VectorQuantizer, skip={"heads", "codebook_size", "dim"})
    _require(codebook.get("strategy", "ema") in ("ema", "gradient"), f"{key}.strategy", codebook.get("strategy"), "must be ema or gradient")
    decay = codebook.get("decay", 0.99)
    _require(0.0 < decay < 1.0, f"{key}.decay", decay, "must be in (0, 1)")
    for name in ("commit_weight", "codebook_weight", "dead_code_threshold", "eps"):
        value = codebook.get(name, 0.0)
        _require(value >= 0, f"{key}.{name}", value, "must be >= 0")
    _positive_int(codebook, key, "kmeans_iters", required=False)


def check_model(model: DictConfig) -> None:
    """Check ``cfg.model`` (Decoder + block + attention + codebook)."""
    target = _target(model, "model")
    check_node(model, "model", target, skip={"pos_embedding"} if "pos_embedding" not in model else set(), nested={"block", "attention", "pos_embedding"})
    for name in ("vocab_size", "d_model", "n_layers"):
        _positive_int(model, "model", name)
    _fraction(model, "model", "embed_dropout")
    block = model.get("block")
    _require(isinstance(block, DictConfig), "model.block", block, "a block config with _target_ is required")
    check_block(block, model.d_model)
    check_attention(model.attention, block)


def check_data(data: DictConfig, model: DictConfig | None = None) -> None:
    """Check ``cfg.data`` (the datamodule node and its nested corpus/source)."""
    target = _target(data, "data")
    nested = {k for k, v in data.items() if isinstance(v, DictConfig) and "_target_" in v}
    check_node(data, "data", target, nested=nested)
    for name in ("seq_len", "batch_size", "vocab_size"):
        _positive_int(data, "data", name)
    for name in nested:
        check_node(data[name], f"data.{name}", _target(data[name], f"data.{name}"))
    if model is not None and model.attention.get("name") == "vq":
        block_len = model.attention.block_len
        _require(block_len <= data.seq_len, "model.attention.block_len", block_len, f"must be <= data.seq_len={data.seq_len} (a block longer than the sequence never uses the cache)")


def validate(cfg: DictConfig) -> None:
    """Validate a composed config: raises :class:`ConfigError` naming the first bad key."""
    try:
        if "model" in cfg:
            check_model(cfg.model)
        if "data" in cfg:
            check_data(cfg.data, cfg.get("model"))
    except ConfigError:
        raise
    except OmegaConfBaseException as err:  # interpolation or missing-value errors
        raise ConfigError(str(getattr(err, "full_key", "config")), "?", str(err).split("\n")[0]) from None


__all__ = ["ConfigError", "check_data", "check_model", "schema_for", "validate"]
