"""``train.py``: train (or resume) as configured; the config is checked before Lightning is imported."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from omegaconf import DictConfig

from tvq_exp.run.extras import extras
from tvq_exp.run.routes import check_routes
from tvq_exp.run.validation import Command, check


def train(cfg: DictConfig, overrides: Sequence[str] | None = None) -> dict[str, Any]:
    """Check ``cfg`` (:func:`tvq_exp.run.validation.check`: a bad value is refused in about 3 s, before
    Lightning is imported), then fit it (:func:`tvq_exp.run.fit.fit`; returns its summary).

    ``overrides``: the keys given for this launch (default: its command line), laid over a checkpoint's
    stored config when ``ckpt_path`` continues a run. A top-level ``codebook_size`` / ``block_len`` given for
    this launch must reach the attention (:func:`tvq_exp.run.routes.check_routes`)."""
    check(cfg, Command.TRAIN)
    check_routes(cfg, overrides)
    from tvq_exp.run.fit import fit  # noqa: PLC0415 - Lightning is imported only for a config that passed

    extras(cfg)
    return fit(cfg, overrides)
