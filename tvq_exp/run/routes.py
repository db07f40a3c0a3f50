"""One route per option: the top-level sizes ``codebook_size`` (S) and ``block_len`` (L) and the attention
options they reach.

conf/train.yaml's ``codebook_size`` and ``block_len`` reach the attention through an interpolation in every
conf/model/attention preset (:data:`ROUTES`: which option of which backend each one sets). A size given for a
launch (on the command line or by a sweep) that does not reach the composed attention, because a preset or
another override pins the attention's own option to another value, would run a sweep that sweeps nothing or
a cross product with one axis ignored: :func:`check_routes` refuses it in one line.
"""

from __future__ import annotations

from collections.abc import Sequence

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from tvq_exp.run.validation import ConfigError

# backend name -> {attention option: the top-level key that is its route}
ROUTES: dict[str, dict[str, str]] = {
    "vq": {"codebook_size": "codebook_size", "block_len": "block_len"},
    "ovq": {"num_centroids": "codebook_size", "block_len": "block_len"},
    "dense": {"window_len": "block_len"},
    "flash_chunk": {"group_size": "block_len"},
}


# the attention options that are a top-level size's route in every backend that has them (dense's window_len is
# not: VQ's window_len is an option of its own), checked on the command line before a multirun launches its jobs
COMMAND_LINE_ROUTES = {
    "codebook_size": ("model.attention.codebook_size", "model.attention.num_centroids"),
    "block_len": ("model.attention.block_len", "model.attention.group_size"),
}


def command_line_conflict(args: Sequence[str]) -> ConfigError | None:
    """The first top-level size and attention option of :data:`COMMAND_LINE_ROUTES` that ``args`` (a command line)
    both set, to different values or value lists (``codebook_size=16,32 model.attention.codebook_size=32``: a
    multirun's cross product, one axis ignored), as a :class:`ConfigError`; ``None`` when there is none."""
    values = {
        arg.split("=", 1)[0].lstrip("+~"): set(arg.split("=", 1)[1].split(","))
        for arg in args
        if "=" in arg and not arg.startswith("-")
    }
    for top, options in COMMAND_LINE_ROUTES.items():
        for option in (o for o in options if top in values and o in values and values[o] != values[top]):
            given = ",".join(sorted(values[top], key=str))
            return ConfigError(
                option,
                ",".join(sorted(values[option], key=str)),
                f"differs from {top}={given}, its route (conf/train.yaml): give one of {top}=... and {option}=..., "
                "or the same values to both",
            )
    return None


def given_keys(overrides: Sequence[str]) -> set[str]:
    """The keys that ``overrides`` (``key=value``, ``+key=value``, ``++key=value``, ``~key``) set."""
    return {item.split("=", 1)[0].lstrip("+~") for item in overrides if "=" in item}


def check_routes(cfg: DictConfig, overrides: Sequence[str] | None = None) -> None:
    """Refuse (:class:`ConfigError`) a top-level ``codebook_size`` / ``block_len`` set by ``overrides`` (default:
    this launch's, a multirun job's swept values included) whose value does not reach the attention option it
    routes to (``model.attention.codebook_size`` etc.)."""
    if overrides is None:
        overrides = list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []
    attention = cfg.model.get("attention") if isinstance(cfg.get("model"), DictConfig) else None
    if not isinstance(attention, DictConfig):
        return
    given = given_keys(overrides)
    for option, top in ROUTES.get(str(attention.get("name")), {}).items():
        if top not in given or option not in attention or attention[option] is None:
            continue
        if attention[option] != cfg[top]:
            raise ConfigError(
                f"model.attention.{option}",
                attention[option],
                f"differs from {top}={cfg[top]}, its route (conf/train.yaml): give one of {top}=... and "
                f"model.attention.{option}=..., or the same value to both",
            )


__all__ = ["COMMAND_LINE_ROUTES", "ROUTES", "check_routes", "command_line_conflict", "given_keys"]
