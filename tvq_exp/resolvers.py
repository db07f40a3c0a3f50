"""The OmegaConf resolvers the config tree uses, registered on import (every entry point imports this):
``${tvq.uid:}`` (a short random id, unique per config), ``${tvq.eq:a,b}``, ``${tvq.or:a,b}`` (``a`` unless it
is null or empty, else ``b``), ``${tvq.min:a,b}``, ``${tvq.steps:n,f}`` (the fraction ``f`` of ``n`` steps,
rounded to an integer: a schedule that scales with ``module.max_steps``), ``${tvq.name:x}`` (``x`` if it is one
plain folder name, else an error), ``${tvq.bits:kind}`` (the name of the bits metric of a data kind: ``bpd``
for images, else ``bpb``; checkpoint file names), ``${tvq.precision:}`` (``bf16-mixed`` where CUDA is available, else ``32-true``) and
``${tvq.checkpoint_run:ckpt_path,run_name}`` (the run dir a resumed run continues in, :func:`checkpoint_run_dir`)."""

from __future__ import annotations

import secrets
from pathlib import Path

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
        "tvq.steps": (lambda n, f: round(int(n) * float(f)), False),
        "tvq.name": (run_dir_name, False),
        "tvq.bits": (lambda kind: "bpd" if kind == "image" else "bpb", False),
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
