"""``train.py``: one pass from the command line to a trained run, each step in its own module.

1. read and verify what the files hold (:func:`tvq_exp.run.resume.read_start`: the checkpoint to continue, read
   by the one safe loader, its stored run checked as data);
2. compose the run from the tree (:func:`tvq_exp.run.compose.compose_run`: the command line, with the stored
   run's model, data, module and seed when it continues one);
3. validate it once (:func:`tvq_exp.run.validation.check`; a new run's bad value is refused before Lightning is
   imported);
4. build (:mod:`tvq_exp.run.build`) and
5. fit (:func:`tvq_exp.run.fit.fit`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from tvq_exp.run.compose import compose_run
from tvq_exp.run.extras import extras
from tvq_exp.run.resume import Start, read_start
from tvq_exp.run.routes import check_routes
from tvq_exp.run.validation import Command, check


def train(cfg: DictConfig, overrides: Sequence[str] | None = None) -> dict[str, Any]:
    """Train ``cfg`` (or continue a run: ``ckpt_path``, ``resume=auto``); returns :func:`~tvq_exp.run.fit.fit`'s
    summary, or the stored summary when nothing is left to train.

    ``overrides``: the keys given for this launch (default: its command line), laid over a checkpoint's stored
    run when ``ckpt_path`` continues it. A top-level ``codebook_size`` / ``block_len`` given for this launch must
    reach the attention (:func:`tvq_exp.run.routes.check_routes`)."""
    start = read_start(cfg)
    cfg = compose_run(cfg, start, overrides)
    check(cfg, Command.TRAIN)
    check_routes(cfg, overrides)
    done = nothing_left(cfg, start)
    if done is not None:
        return done
    from tvq_exp.run.fit import fit  # noqa: PLC0415 - Lightning is imported only for a config that passed

    extras(cfg)
    return fit(cfg, start)


def nothing_left(cfg: DictConfig, start: Start) -> dict[str, Any] | None:
    """When ``start`` is already at ``trainer.max_steps``: one line, and the run's summary (its ``finished.json``,
    else the step alone); a relaunched run that finished is skipped the same way. Otherwise None (and one line
    says where training resumes)."""
    from tvq_exp.console import say  # noqa: PLC0415 - imports Lightning
    from tvq_exp.run.checkpoints import finished_summary  # noqa: PLC0415

    max_steps = cfg.trainer.max_steps
    if cfg.get("resume") == "auto":
        finished = start.finished
        if finished is not None and finished["global_step"] >= max_steps:
            say(
                f"run dir {cfg.paths.output_dir}: finished at step {finished['global_step']}; skipped (resume=auto)"
            )
            return finished
        if start.checkpoint is None:
            say(f"run dir {cfg.paths.output_dir}: no checkpoint yet, starting from scratch (resume=auto)")
        else:
            say(f"resuming from {start.checkpoint} (resume=auto)")
        return None
    if start.checkpoint is None:
        return None
    if start.step < max_steps:
        say(f"resuming {start.checkpoint} at step {start.step} of {max_steps}")
        return None
    say(
        f"{start.checkpoint} is at step {start.step}, trainer.max_steps={max_steps}: nothing to train "
        "(give trainer.max_steps=N to go on)"
    )
    empty = {"best_val_bpb": None, "best_ckpt": None, "last_ckpt": start.checkpoint, "val": None}
    return finished_summary(Path(cfg.paths.output_dir)) or {**empty, "global_step": start.step}
