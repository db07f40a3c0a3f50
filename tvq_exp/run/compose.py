"""Step 2 of a train run: compose the run from the project's config tree (:func:`compose_run`).

The command line was composed with ``conf/`` by Hydra (``cfg``). A run that continues a checkpoint takes from the
checkpoint only its stored run (:mod:`tvq_exp.run.stored`: ``model``, ``data``, ``module`` and ``seed``, plain data
whose classes the tree picks), since the weights, the optimiser and the sampler state must match them; everything
else (``trainer``, ``callbacks``, ``logger``, ``paths``, ``guard``, the commands' options) is the tree's and the
command line's, never the file's.

* ``resume=auto`` (the same command launched again): the stored parts replace the command line's, and the
  learning-rate schedule follows ``trainer.max_steps``.
* ``ckpt_path=`` (continue a run, maybe with changes): the command line's explicit keys below ``model``, ``data``,
  ``module`` and ``seed`` are laid over the stored ones (``~key`` deletes one). ``trainer.max_steps`` is the stored
  schedule's length (``module.max_steps``) unless given; given, the schedule follows it unless ``module.max_steps``
  is given too. A group that sets keys all over the config (``experiment=``, ``debug=``) or a top-level key that
  reaches the model only through an interpolation (``block_len``, ``codebook_size``, ``codebook``: the stored model
  holds their resolved values; one that gives the stored value again passes) cannot be laid over a stored run: a
  one-line :class:`ConfigError`.

The result is validated once, as a whole, by :func:`tvq_exp.run.validation.check`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf

from tvq_exp.run.resume import Start
from tvq_exp.run.stored import STORED_PARTS
from tvq_exp.run.validation import ConfigError, interpolation_errors

STORED_KEYS = (*STORED_PARTS, "seed")  # what a continued run takes from its checkpoint
# top-level keys that reach the model only through interpolations (conf/train.yaml, conf/model/attention/*.yaml)
ROUTES = ("block_len", "codebook_size", "codebook")
MISSING = object()


def compose_run(cfg: DictConfig, start: Start, overrides: Sequence[str] | None = None) -> DictConfig:
    """The config of the run that ``start`` begins (module doc); ``overrides``: this launch's command-line
    overrides (default: Hydra's record of them, :func:`explicit_overrides`)."""
    if start.stored is None:
        return cfg
    given = explicit_overrides() if overrides is None else list(overrides)
    run = cfg.copy()
    OmegaConf.set_struct(run, False)
    stored = OmegaConf.create({key: start.stored[key] for key in STORED_KEYS})
    if start.relaunch:
        for key in STORED_PARTS:
            run[key] = stored[key]
        run.module.max_steps = run.trainer.max_steps
        return run
    changed = _laid_over(stored, cfg, given)
    for key in STORED_KEYS:
        run[key] = stored[key]
    if "trainer.max_steps" not in given_keys(given):
        run.trainer.max_steps = run.module.max_steps  # the stored run's own length
    elif "module.max_steps" not in changed:
        run.module.max_steps = run.trainer.max_steps
    return run


def given_keys(overrides: Sequence[str]) -> set[str]:
    """The keys (or groups, ``a/b`` as ``a.b``) that ``overrides`` set, without ``+`` / ``++`` / ``~``."""
    return {
        o.key_or_group.replace("/", ".") for o in OverridesParser.create().parse_overrides(list(overrides))
    }


def _laid_over(stored: DictConfig, cfg: DictConfig, overrides: Sequence[str]) -> set[str]:
    """Lay this launch's explicit keys below :data:`STORED_KEYS` over ``stored`` (their values from ``cfg``,
    resolved); the keys laid. A group or key that cannot be laid over a stored run is a :class:`ConfigError`."""
    changed = set()
    for override in OverridesParser.create().parse_overrides(list(overrides)):
        path = override.key_or_group.replace("/", ".")
        top = path.split(".")[0]
        if top in ROUTES and _route_changes(cfg, stored, top):
            raise ConfigError(
                path, override.value(), "reaches the model through an interpolation, and a stored "
                "run holds the resolved values: with ckpt_path give the model's own key instead "
                f"({'++model.attention.codebook.<option>' if top == 'codebook' else f'model.attention.{top}'}=...)",
            )  # fmt: skip
        if (
            top not in STORED_KEYS
        ):  # the routes that change nothing (the stored run's own values) end here too
            known = top == "hydra" or override.is_delete()
            if not known and OmegaConf.select(cfg, path, default=MISSING) is MISSING:
                raise ConfigError(
                    path, override.value(), "a group that sets keys all over the config cannot "
                    "be laid over a stored run (ckpt_path): give the keys it sets instead (e.g. trainer.max_steps=N)",
                )  # fmt: skip
            continue  # the tree's and the command line's already
        if override.is_delete():
            parent, _, leaf = path.rpartition(".")
            node = OmegaConf.select(stored, parent) if parent else stored
            if isinstance(node, DictConfig) and leaf in node:
                del node[leaf]
            continue
        with interpolation_errors():
            value = _resolved(OmegaConf.select(cfg, path))
        OmegaConf.update(stored, path, value, merge=False, force_add=True)
        changed.add(path)
    return changed


def _route_changes(cfg: DictConfig, stored: DictConfig, top: str) -> bool:
    """Whether the top-level key ``top`` (:data:`ROUTES`) gives the model a value other than the stored run's
    (``codebook=healthy`` repeated for a run trained with it changes nothing, and passes)."""
    key = f"model.attention.{top}"
    with interpolation_errors():
        given = _resolved(OmegaConf.select(cfg, key, default=None))
    return given != _resolved(OmegaConf.select(stored, key, default=None))


def _resolved(value: Any) -> Any:
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


def explicit_overrides() -> list[str]:
    """This launch's command-line overrides (``key=value``, ``group=option``, ``+key=value``, ``~key``)."""
    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []


__all__ = ["compose_run", "explicit_overrides", "given_keys"]
