"""Validation of a composed Hydra config, before any data is read or any step is trained.

Over 300 lines: one walk over the whole config tree (the commands' own options, the model, the data, the
module) with the schema generation and the error location it shares; split, each part would re-import the rest.

Every rule lives in the constructors (:mod:`tvq_exp.options`); this module only asks them, and names the
config key when they refuse. The command says what it is (:class:`Command`); nothing is guessed from the keys.

1. **Types and unknown keys** (:func:`check`, nothing built). For each node with a ``_target_`` (the model,
   its block, attention and codebook, the position embedding, the data module and its corpus or image
   source, the Lightning module), a dataclass is generated from the target's constructor signature (with its
   base class's where the constructor hands ``**options`` on: :func:`~tvq_exp.options.option_functions`) and the
   node is merged into it with OmegaConf: unknown keys (typos) and values of the wrong type are refused with
   the full key.
2. **Single-option rules** (ranges, choices): the ``Annotated`` constraints of the same signature.
   :func:`check` walks the command's options and the model first: their classes need torch only, so a bad
   value there is refused before Lightning is imported (the data module, the Lightning module and the
   trainer come after; their classes import it).
3. **Rules that tie options together** (``kv_heads`` divides ``heads``, ``window_len <= block_len``, the
   image shape of a data set, ...) are the constructors' own: :func:`build_run` builds the model and the data
   module once, and an :class:`~tvq_exp.options.OptionError` of any constructor is traced back to its key.
4. **Model against data**, in :func:`build_run` too: the model's own
   :meth:`~tvq_exp.models.decoder.Decoder.check_context` and the data module's ``check_accumulation``.

``train.py`` calls :func:`check` once and :func:`build_run` once (the model it trains, on its device);
:func:`validate` is both with the model on the meta device (no memory), for dry runs and tests.
Every failure is a :class:`ConfigError` whose one-line message names the key, the bad value and what is
allowed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import enum
import inspect
import re
import types
import typing
from collections.abc import Callable, Iterator
from typing import Any

import torch
from hydra.errors import InstantiationException
from hydra.utils import get_method, get_object, instantiate
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from tvq_exp.attention.base import INJECTED_ARGUMENTS
from tvq_exp.attention.registry import BACKENDS, build_attention
from tvq_exp.options import OptionError, check_values, constraints, option_functions
from tvq_exp.quantize.codebook import VectorQuantizer
from tvq_exp.run import schema

HYDRA_KEYS = {"_target_", "_partial_", "_recursive_", "_convert_", "_args_"}
SIMPLE_TYPES = (int, float, bool, str)
# arguments a parent passes to its child's constructor (not config keys of the child's node)
INJECTED = {
    "model": {"block", "attention", "pos_embedding"},
    "model.block": {"d_model", "attention"},
    "model.attention": {"codebook", *INJECTED_ARGUMENTS},
    "model.attention.codebook": {"heads", "codebook_size", "dim"},
    "module": {"model", "run_config"},
    "data.task": {"seq_len", "vocab_size"},  # a synthetic probe's task gets the data module's row shape
}


class ConfigError(ValueError):
    """A config value that is not allowed; ``str(err)`` is ``"<key>=<value>: <what is allowed>"``."""

    def __init__(self, key: str, value: Any, allowed: str) -> None:
        self.key, self.value, self.allowed = key, value, allowed
        super().__init__(f"{key}={value!r}: {allowed}")


@dataclasses.dataclass(frozen=True)
class Node:
    """A config node with a ``_target_``: its key, the node, and the class (or function) it builds."""

    key: str
    node: DictConfig
    target: Any


# --------------------------------------------------------------------------------------- schemas
def _field_type(annotation: Any) -> Any:
    """Map a constructor annotation to a type OmegaConf can check (``Any`` when it cannot)."""
    if annotation in SIMPLE_TYPES:
        return annotation
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return typing.Optional[rest[0]] if len(rest) == 1 and rest[0] in SIMPLE_TYPES else Any  # noqa: UP045
    return Any


def _parameters(target: Callable[..., Any]) -> Iterator[tuple[inspect.Parameter, Any]]:
    """Every named parameter of ``target``'s options (:func:`~tvq_exp.options.option_functions`: a class's own
    constructor first, then what it hands on to its base) with its type hint; each name once."""
    seen = {"self"}
    for fn in option_functions(target):
        hints = typing.get_type_hints(fn)
        for name, p in inspect.signature(fn).parameters.items():
            if name not in seen and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                seen.add(name)
                yield p, hints.get(name, Any)


def schema_for(target: Callable[..., Any], skip: set[str] = frozenset()) -> type:
    """A dataclass with one field per keyword argument of ``target`` (``**kwargs`` passed to nothing: none)."""
    fields = []
    for p, hint in _parameters(target):
        name = p.name
        if name in skip:
            continue
        default = dataclasses.MISSING if p.default is p.empty else p.default
        if default is not dataclasses.MISSING and not isinstance(default, (*SIMPLE_TYPES, type(None))):
            default = None
        typ = _field_type(hint)
        fields.append(
            (name, typ, dataclasses.field(default=default))
            if default is not dataclasses.MISSING
            else (name, typ)
        )
    fields.sort(key=lambda f: len(f) == 3)  # required fields first
    return dataclasses.make_dataclass(f"{getattr(target, '__name__', 'Target')}Config", fields)


def _key(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def check_node(
    node: DictConfig,
    key: str,
    target: Callable[..., Any],
    skip: set[str] = frozenset(),
    nested: set[str] = frozenset(),
) -> None:
    """Type-check ``node`` against ``target``'s signature, then its single-option rules; ``nested`` keys
    (child nodes) are checked separately."""
    schema_class = schema_for(target, skip | nested)
    schema = OmegaConf.structured(schema_class)
    plain = {k: v for k, v in node.items() if k not in HYDRA_KEYS | nested}
    allowed = sorted(set(schema.keys()))
    for name in plain:
        if name not in allowed:
            raise ConfigError(
                _key(key, name),
                plain[name],
                f"unknown option for {_name(target)}; allowed: {', '.join(allowed)}",
            )
    try:
        OmegaConf.merge(schema, OmegaConf.create(plain))
    except OmegaConfBaseException as err:
        bad = str(getattr(err, "full_key", "") or err).split("\n")[0]
        name = bad if bad in plain else next((n for n in plain if n in str(err)), bad)
        expected = schema_class.__dataclass_fields__.get(name)
        kind = type_name(expected.type) if expected else "a valid value"
        raise ConfigError(_key(key, name), plain.get(name), f"must be of type {kind}") from None
    for name in schema.keys():
        if OmegaConf.is_missing(schema, name) and name not in plain:
            raise ConfigError(_key(key, name), "???", f"required by {_name(target)}")
    try:
        check_values(None, constraints(target), plain)
    except OptionError as err:
        raise ConfigError(_key(key, err.option), err.value, err.allowed) from None


def _name(target: Any) -> str:
    return getattr(target, "__qualname__", str(target))


def type_name(annotation: Any) -> str:
    """``int``, ``int or null``, ...: a schema field's type as a user reads it."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 1:
        return f"{type_name(args[0])} or null"
    return getattr(annotation, "__name__", str(annotation))


def _target(node: DictConfig, key: str) -> Any:
    path = node.get("_target_")
    if not path:
        raise ConfigError(f"{key}._target_", path, "a dotted path to a class or function is required")
    try:
        return get_object(path) if "." in path else get_method(path)
    except Exception:  # noqa: BLE001 - any import failure means the path is wrong
        raise ConfigError(f"{key}._target_", path, "cannot be imported; check the dotted path") from None


# --------------------------------------------------------------------------------------- the tree
def model_nodes(model: DictConfig) -> list[Node]:
    """The model's target nodes, most specific first: codebook, attention, block, position embedding, decoder."""
    nodes = [Node("model", model, _target(model, "model"))]
    block = model.get("block")
    if not isinstance(block, DictConfig):
        raise ConfigError("model.block", block, "a block config with _target_ is required")
    nodes.insert(0, Node("model.block", block, _target(block, "model.block")))
    if isinstance(model.get("pos_embedding"), DictConfig):
        nodes.insert(
            0,
            Node(
                "model.pos_embedding",
                model.pos_embedding,
                _target(model.pos_embedding, "model.pos_embedding"),
            ),
        )
    attention = model.get("attention")
    if not isinstance(attention, DictConfig):
        raise ConfigError(
            "model.attention", attention, "an attention config (model/attention=...) is required"
        )
    name = attention.get("name")
    if _target(attention, "model.attention") is build_attention and name not in BACKENDS:
        raise ConfigError(
            "model.attention.name", name, f"unknown backend; choose one of {', '.join(sorted(BACKENDS))}"
        )
    nodes.insert(0, Node("model.attention", attention, BACKENDS.get(name, build_attention)))
    if isinstance(attention.get("codebook"), DictConfig):
        if not getattr(BACKENDS.get(name), "has_codebook", False):
            raise ConfigError(
                "model.attention.codebook",
                "...",
                f"the {name} backend has no codebook; codebook options apply to "
                f"{', '.join(n for n, b in BACKENDS.items() if b.has_codebook)}",
            )
        nodes.insert(0, Node("model.attention.codebook", attention.codebook, VectorQuantizer))
    return nodes


def module_nodes(module: DictConfig) -> list[Node]:
    """The Lightning module's node (its constructor's rules between options, ``betas``, are met when it is built)."""
    return [Node("module", module, _target(module, "module"))]


def data_nodes(data: DictConfig) -> list[Node]:
    """The data module's target nodes: its corpus / image source first, then the module."""
    nodes = [
        Node(f"data.{k}", v, _target(v, f"data.{k}"))
        for k, v in data.items()
        if isinstance(v, DictConfig) and "_target_" in v
    ]
    return [*nodes, Node("data", data, _target(data, "data"))]


def check_nodes(nodes: list[Node]) -> None:
    """Types, unknown keys and single-option rules of every node."""
    children = {
        n.key: {m.key.rpartition(".")[2] for m in nodes if m.key.rpartition(".")[0] == n.key} for n in nodes
    }
    for n in nodes:
        nested = children[n.key] | ({"name"} if n.key == "model.attention" else set())
        check_node(n.node, n.key, n.target, skip=INJECTED.get(n.key, set()), nested=nested)


def locate(error: OptionError, nodes: list[Node]) -> str:
    """The config key an :class:`OptionError` is about: the option in the node that builds its owner, else
    in the nearest node above it that has that key (``heads`` of the attention is ``model.block.heads``)."""
    owners = [
        i
        for i, n in enumerate(nodes)
        if inspect.isclass(n.target) and error.owner is not None and issubclass(error.owner, n.target)
    ]
    start = owners[0] if owners else len(nodes) - 1
    for n in nodes[start:]:
        if error.option in n.node:
            return f"{n.key}.{error.option}"
    return f"{nodes[start].key}.{error.option}"


@contextlib.contextmanager
def located(nodes: list[Node]) -> Iterator[None]:
    """Turn an :class:`OptionError` raised inside (by a constructor, directly or through Hydra) into a
    :class:`ConfigError` on its key among ``nodes``."""
    try:
        yield
    except (InstantiationException, OptionError) as err:
        cause = next((e for e in _causes(err) if isinstance(e, OptionError)), None)
        if cause is None:
            raise
        raise ConfigError(locate(cause, nodes), cause.value, cause.allowed) from None


def built(cfg: DictConfig, nodes: list[Node], device: str | None = None) -> Any:
    """Instantiate ``cfg`` (under ``torch.device(device)`` when given: ``"meta"`` allocates no memory), an
    :class:`OptionError` from any constructor turned into a :class:`ConfigError` on its key."""
    with located(nodes), torch.device(device) if device else contextlib.nullcontext():
        return instantiate(cfg)


@contextlib.contextmanager
def interpolation_errors() -> Iterator[None]:
    """Turn OmegaConf's interpolation or missing-value errors into a :class:`ConfigError` on their key."""
    try:
        yield
    except OmegaConfBaseException as err:
        raise ConfigError(str(getattr(err, "full_key", "config")), "?", str(err).split("\n")[0]) from None


def _causes(error: BaseException) -> Iterator[BaseException]:
    while error is not None:
        yield error
        error = error.__cause__ or error.__context__


# --------------------------------------------------------------------------------------- the commands
class Command(enum.Enum):
    """The entry point whose config is checked: what its config holds is the command's, never guessed."""

    TRAIN = "train"  # train.py: its options, the model, data, module, trainer and guard
    EVAL = "eval"  # eval.py: its options (the model and data come from the checkpoint)
    SAMPLE = "sample"  # sample.py: its options (the model comes from the checkpoint)


TRAIN_NODES = {
    "model",
    "codebook",
    "data",
    "module",
    "guard",
    "trainer",
    "logger",
    "callbacks",
    "paths",
    "hydra",
}
# (codebook: the top-level codebook group, checked where the VQ attention reads it, model.attention.codebook)
COMMAND_OPTIONS = {
    Command.TRAIN: (schema.train_options, TRAIN_NODES),
    Command.EVAL: (schema.eval_options, {"paths", "hydra", "model_options"}),
    Command.SAMPLE: (schema.sample_options, {"paths", "hydra"}),
}


def check_trainer(trainer: DictConfig) -> None:
    """``trainer``: a name ``lightning.pytorch.Trainer`` takes (typos refused, with the nearest name), and the
    values tvq_exp relies on in range (:func:`tvq_exp.run.schema.trainer_options`)."""
    import lightning.pytorch as pl  # noqa: PLC0415 - only once the model's options passed (fast refusal)

    known = set(inspect.signature(pl.Trainer.__init__).parameters) - {"self"}
    for name in trainer.keys():
        if name not in known | HYDRA_KEYS:
            near = difflib.get_close_matches(str(name), sorted(known), n=1)
            hint = f"did you mean trainer.{near[0]}? " if near else ""
            raise ConfigError(
                f"trainer.{name}", trainer[name], f"{hint}not an argument of lightning.pytorch.Trainer"
            )
    checked = set(inspect.signature(schema.trainer_options).parameters)
    subset = OmegaConf.create({k: trainer[k] for k in trainer.keys() if k in checked})
    check_node(subset, "trainer", schema.trainer_options)


def check_run_options(cfg: DictConfig) -> None:
    """``resume``, ``run_name``, ``ckpt_path`` and ``init_from`` of train.py (see docs/reliability.md): the
    checkpoints they name exist, and they do not contradict each other."""
    from tvq_exp.run.checkpoints import is_checkpoint  # noqa: PLC0415 - imports Lightning: only when one is named

    resume = cfg.get("resume")
    if resume == "auto" and not cfg.get("run_name"):
        raise ConfigError(
            "resume", resume, "needs run_name=<name>: the fixed run directory a relaunch finds again"
        )
    if resume == "auto" and cfg.get("ckpt_path"):
        raise ConfigError("ckpt_path", cfg.ckpt_path, "set either ckpt_path or resume=auto, not both")
    for key in ("init_from", "ckpt_path"):
        if cfg.get(key) and not is_checkpoint(cfg[key]):
            raise ConfigError(key, cfg[key], "no such checkpoint file (or sharded checkpoint folder)")


def check_monitors(cfg: DictConfig) -> None:
    """Every callback's ``monitor`` names a metric the run logs (:func:`logged_metrics`): a name it never logs
    would fail only after the first validation, or never."""
    logged = logged_metrics(cfg.data)
    for name, node in (cfg.get("callbacks") or {}).items():
        if isinstance(node, DictConfig) and node.get("monitor") is not None and node.monitor not in logged:
            raise ConfigError(
                f"callbacks.{name}.monitor",
                node.monitor,
                f"not a metric this run logs; one of {', '.join(logged)}",
            )


def logged_metrics(data: DictConfig) -> list[str]:
    """The metrics a run on ``data`` logs at validation that a callback can monitor
    (:class:`~tvq_exp.models.module.AutoregressiveLitModule`: loss and bits per byte, bits per dim for images,
    accuracy for data with answers, the synthetic tasks)."""
    names = ["val/loss", "val/bpb"]
    if data.get("kind") == "image":
        names.append("val/bpd")
    if isinstance(data.get("task"), DictConfig):
        names += ["val/acc", "val/acc_seq"]
    return names


def check_trainer_conflicts(trainer: DictConfig) -> None:
    """:func:`tvq_exp.run.schema.trainer_conflicts` as a :class:`ConfigError`."""
    values = {key: trainer.get(key) for key in schema.CONFLICT_KEYS if key in trainer}
    conflict = schema.trainer_conflicts(values, torch.cuda.is_available())
    if conflict is not None:
        raise ConfigError(*conflict)


# --------------------------------------------------------------------------------------- entry points
def check(cfg: DictConfig, command: Command) -> None:
    """Check a composed config without building anything: types, unknown keys and single-option rules of the
    command's options and, for :attr:`Command.TRAIN`, of every node. The command's options and the model come
    first (torch only); raises :class:`ConfigError` naming the first bad key."""
    options, nested = COMMAND_OPTIONS[command]
    try:
        with interpolation_errors():
            check_node(cfg, "", options, nested=nested)
            if command is Command.TRAIN:
                check_train_nodes(cfg)
    except ConfigError as err:
        raise blamed_on_source(cfg, err) from None


def blamed_on_source(cfg: DictConfig, error: ConfigError) -> ConfigError:
    """``error`` on the key its value comes from, when the bad value (or a node above it) is an interpolation of
    exactly one other key (``block_len: ${tvq.min:512,${data.seq_len}}`` with ``data.seq_len=0`` names
    ``data.seq_len``; ``model.attention.codebook: ${codebook}`` with ``codebook.decay=2`` names ``codebook.decay``)."""
    parts = error.key.split(".")
    for depth in range(len(parts), 0, -1):
        source = single_source(cfg, ".".join(parts[: depth - 1]), parts[depth - 1])
        if source is None:
            continue
        if depth == len(parts):
            value = OmegaConf.select(cfg, source, throw_on_resolution_failure=False)
            return ConfigError(source, value, f"{error.allowed} (it sets {error.key})")
        return ConfigError(".".join([source, *parts[depth:]]), error.value, error.allowed)
    return error


def single_source(cfg: DictConfig, parent: str, name: str) -> str | None:
    """The one key that ``parent.name``'s raw value interpolates (``None``: not an interpolation of one key)."""
    node = OmegaConf.select(cfg, parent) if parent else cfg
    raw = node._get_node(name)._value() if isinstance(node, DictConfig) and name in node else None
    sources = set(re.findall(r"\$\{([A-Za-z_][\w.]*)\}", raw)) if isinstance(raw, str) else set()
    return sources.pop() if len(sources) == 1 else None


def check_train_nodes(cfg: DictConfig) -> None:
    """Every node of a train config, the model first (its classes need torch only; the rest import Lightning)."""
    check_nodes(model_nodes(cfg.model))
    check_node(cfg.guard, "guard", schema.guard_options)
    check_trainer(cfg.trainer)
    check_trainer_conflicts(cfg.trainer)
    check_nodes(data_nodes(cfg.data))
    check_node(cfg.module, "module", _target(cfg.module, "module"), skip=INJECTED["module"])
    check_cuda_graph_accumulation(cfg)
    check_monitors(cfg)
    check_run_options(cfg)


def check_cuda_graph_accumulation(cfg: DictConfig) -> None:
    """A step replayed from CUDA graphs (``module.compile_mode`` ``reduce-overhead`` or ``max-autotune``) with
    gradient accumulation is refused: each micro-batch marks a new step for the graphs, whose next replay may write
    the backward's outputs where the last micro-batch's gradients still lie (``.grad`` may hold a graph's output
    itself), and no device test has shown the sum right."""
    from tvq_exp.models.module import CUDA_GRAPH_MODES  # noqa: PLC0415 - imports Lightning, as the trainer's check

    mode, accumulate = cfg.module.get("compile_mode"), int(cfg.trainer.get("accumulate_grad_batches") or 1)
    if cfg.module.get("compile") and mode in CUDA_GRAPH_MODES and accumulate > 1:
        raise ConfigError(
            "module.compile_mode", mode,
            f"CUDA graphs with trainer.accumulate_grad_batches={accumulate} are not supported: set "
            "module.compile_mode=default (or max-autotune-no-cudagraphs), or accumulate 1",
        )  # fmt: skip


def check_parts(parts: DictConfig) -> None:
    """A stored run's ``model``, ``data`` and ``module`` (``eval.py``, ``sample.py``: :mod:`tvq_exp.run.stored`,
    with the command's own changes laid on) against the same signatures as a train config's."""
    try:
        with interpolation_errors():
            check_nodes(model_nodes(parts.model))
            check_nodes(data_nodes(parts.data))
            check_node(parts.module, "module", _target(parts.module, "module"), skip=INJECTED["module"])
    except ConfigError as err:
        raise blamed_on_source(parts, err) from None


def build_run(cfg: DictConfig, device: str | None = None) -> tuple[Any, Any]:
    """Build a checked train config's data module and model, once -> ``(model, datamodule)``.

    The model is built under ``torch.device(device)`` (``"meta"``: no memory); the rules that tie options
    together are the constructors', and an :class:`OptionError` of any of them becomes a :class:`ConfigError`
    on its key, as do the model's :meth:`~tvq_exp.models.decoder.Decoder.check_context` against the data's
    context length and the data module's ``check_accumulation`` against ``trainer.accumulate_grad_batches``.
    """
    with interpolation_errors():
        data = built(cfg.data, data_nodes(cfg.data))
        nodes = model_nodes(cfg.model)
        model = built(cfg.model, nodes, device)
        with located(data_nodes(cfg.data)):
            data.check_accumulation(int(cfg.trainer.get("accumulate_grad_batches") or 1))
        with located(nodes):
            model.check_context(data.context_len)
    return model, data


def validate(cfg: DictConfig, command: Command = Command.TRAIN) -> None:
    """Every check of a composed config (a dry run): :func:`check`, then for :attr:`Command.TRAIN`
    :func:`build_run` with the model on the meta device. Raises :class:`ConfigError` naming the first bad key."""
    check(cfg, command)
    if command is Command.TRAIN:
        build_run(cfg, device="meta")


__all__ = [
    "Command", "ConfigError", "build_run", "check", "check_node", "check_parts", "located", "logged_metrics",
    "module_nodes", "schema_for",
    "type_name", "validate",
]  # fmt: skip
