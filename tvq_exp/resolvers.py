"""The OmegaConf resolvers the config tree uses, registered on import (every entry point imports this):
``${tvq.uid:}`` (a short random id, unique per config), ``${tvq.eq:a,b}``, ``${tvq.or:a,b}`` (``a`` unless it
is null or empty, else ``b``), ``${tvq.min:a,b}``, ``${tvq.precision:}`` (``bf16-mixed`` where CUDA is
available, else ``32-true``) and ``${tvq.checkpoint_run:ckpt_path,run_name}`` (the run dir a resumed run
continues in, :func:`checkpoint_run_dir`)."""

from __future__ import annotations

import secrets
from pathlib import Path

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
        "tvq.checkpoint_run": (checkpoint_run_dir, False),
    }
    for name, (fn, cache) in resolvers.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn, use_cache=cache)


RUN_CHECKPOINTS = "checkpoints"  # a run dir's checkpoint folder (tvq_exp.callbacks.checkpoint.CHECKPOINT_DIR)


def checkpoint_run_dir(ckpt_path: str | None, run_name: str | None) -> str | None:
    """The run dir a resumed run continues in: the folder holding the checkpoint's ``checkpoints/`` folder, or
    None (a new run dir) when ``run_name`` is set or the checkpoint lies elsewhere."""
    if not ckpt_path or run_name:
        return None
    parent = Path(ckpt_path).parent
    return str(parent.parent) if parent.name == RUN_CHECKPOINTS else None


register()
