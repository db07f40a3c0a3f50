"""What a user sees at the terminal: one line at a time on rank 0, and Lightning's start-up chatter silenced."""

from __future__ import annotations

import logging
import sys
import warnings

from lightning.pytorch.utilities.rank_zero import rank_zero_only

QUIET_LOGGERS = (
    "lightning.pytorch.utilities.rank_zero",
    "lightning.pytorch.accelerators.cuda",
    "lightning.fabric.utilities.seed",
    "lightning.fabric.utilities.rank_zero",
    "lightning.fabric.utilities.distributed",
    "lightning.pytorch.trainer.connectors.checkpoint_connector",  # "`weights_only` was not set" on every save
)
NOISY_WARNINGS = (
    r".*does not have many workers.*",
    r".*smaller than the logging interval.*",
    r".*exists and is not empty.*",
    r".*`isinstance\(treespec, LeafSpec\)` is deprecated.*",
    r".*overridden `on_before_batch_transfer` in `LightningModule` but have passed in a.*",  # wanted (module.py)
)


@rank_zero_only
def say(message: str) -> None:
    """Print one line on rank 0."""
    print(message, file=sys.stdout, flush=True)


def quiet() -> None:
    """Silence Lightning's start-up chatter (accelerator lines, tips, seeds) and noise warnings."""
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    for pattern in NOISY_WARNINGS:
        warnings.filterwarnings("ignore", message=pattern)


__all__ = ["quiet", "say"]
