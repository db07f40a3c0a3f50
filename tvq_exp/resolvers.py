"""The OmegaConf resolvers the config tree uses, registered on import (every entry point imports this):
``${tvq.uid:}`` (a short random id, unique per config), ``${tvq.eq:a,b}``, ``${tvq.or:a,b}`` (``a`` unless it
is null or empty, else ``b``), ``${tvq.min:a,b}``, ``${tvq.precision:}`` (``bf16-mixed`` where CUDA is
available, else ``32-true``) and ``${tvq.checkpoint_run:ckpt_path,run_name}`` (the run dir a resumed run
continues in, :func:`tvq_exp.run.resume.checkpoint_run_dir`)."""

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
        "tvq.checkpoint_run": (_checkpoint_run, False),
    }
    for name, (fn, cache) in resolvers.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn, use_cache=cache)


def _checkpoint_run(ckpt_path: str | None, run_name: str | None) -> str | None:
    from tvq_exp.run.resume import checkpoint_run_dir  # lazily: the resolvers load before Lightning

    return checkpoint_run_dir(ckpt_path, run_name)


register()
