"""The OmegaConf resolvers the config tree uses, registered on import (every entry point imports this):
``${tvq.uid:}`` (a short random id, unique per config), ``${tvq.eq:a,b}``, ``${tvq.or:a,b}`` (``a`` unless it
is null or empty, else ``b``), ``${tvq.min:a,b}``, ``${tvq.name:x}`` (``x`` if it is one plain folder name, else an error) and ``${tvq.precision:}`` (``bf16-mixed`` where CUDA is
available, else ``32-true``)."""

from __future__ import annotations

import secrets

import torch
from omegaconf import OmegaConf


def run_dir_name(name: object) -> object:
    """``${tvq.name:run_name}``: ``run_name`` when it is one plain folder name (the rule of
    ``tvq_exp.options.PlainName``, which validation applies too); a path like ``../../x`` is refused here,
    before Hydra creates the run directory it would name."""
    if name is None or isinstance(name, int) or (isinstance(name, str) and name and name.strip() == name and "/" not in name
                        and "\\" not in name and not name.startswith(".")):  # fmt: skip
        return name
    raise ValueError(
        f"run_name={name!r}: must be one plain folder name (no '/', no leading '.', not empty): "
        "the run dir stays in the log dir"
    )


def register() -> None:
    """Register every ``tvq.*`` resolver (once per process)."""
    resolvers = {
        "tvq.uid": (lambda: secrets.token_hex(3), True),
        "tvq.eq": (lambda a, b: str(a) == str(b), False),
        "tvq.or": (lambda a, b: b if a in (None, "") else a, False),
        "tvq.min": (lambda a, b: min(int(a), int(b)), False),
        "tvq.name": (run_dir_name, False),
        "tvq.precision": (lambda: "bf16-mixed" if torch.cuda.is_available() else "32-true", False),
    }
    for name, (fn, cache) in resolvers.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn, use_cache=cache)


register()
