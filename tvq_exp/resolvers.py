"""The OmegaConf resolvers the config tree uses, registered on import (every entry point imports this):
``${tvq.uid:}`` (a short random id, unique per config), ``${tvq.eq:a,b}``, ``${tvq.or:a,b}`` (``a`` unless it
is null or empty, else ``b``), ``${tvq.min:a,b}`` and ``${tvq.precision:}`` (``bf16-mixed`` where CUDA is
available, else ``32-true``)."""

from __future__ import annotations

import secrets

import torch
from omegaconf import OmegaConf


def register() -> None:
    """Register every ``tvq.*`` resolver (once per process)."""
    resolvers = {
        "tvq.uid": (lambda: secrets.token_hex(3), True),
        "tvq.eq": (lambda a, b: str(a) == str(b), False),
        "tvq.or": (lambda a, b: b if a in (None, "") else a, False),
        "tvq.min": (lambda a, b: min(int(a), int(b)), False),
        "tvq.precision": (lambda: "bf16-mixed" if torch.cuda.is_available() else "32-true", False),
    }
    for name, (fn, cache) in resolvers.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn, use_cache=cache)


register()
