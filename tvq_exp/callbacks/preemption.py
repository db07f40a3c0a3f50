"""Preemption: SIGTERM / SIGUSR1 during training save ``last.ckpt`` and stop cleanly (exit status 0).

The handlers are installed when training starts (replacing Lightning's SIGTERM handler, which would
stop without a checkpoint) and restored when it ends. The signal only sets a flag; at the end of the
current training batch the callback writes ``last.ckpt`` (the state Lightning's mid-epoch restart expects,
as for ``ModelCheckpoint(every_n_train_steps=...)``) and raises Lightning's own SIGTERM flag, so the loop
finishes the step's logging (a validation due at that step is skipped) and leaves ``fit`` with
``SIGTERMException``, which the train command turns into a normal return. (``trainer.should_stop`` is not used: it runs an extra
validation and shifts the logged step numbers of the resumed run.) ``resume=auto`` then continues.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.rank_zero import rank_zero_warn

from tvq_exp.callbacks.checkpoint import save_last

DEFAULT_SIGNALS = ("SIGTERM", "SIGUSR1")


class Preemption(Callback):
    """On any of ``signals``: checkpoint at the end of the current batch and stop training.

    After ``fit``, :attr:`signal_name` is the name of the signal received (``None`` if none was).
    """

    def __init__(self, signals: Sequence[str] = DEFAULT_SIGNALS) -> None:
        self.signals = [signal.Signals[name] for name in signals]
        self.signal_name: str | None = None
        self._saved = False
        self._previous: dict[signal.Signals, Any] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.signal_name = signal.Signals(signum).name

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.signal_name, self._saved = None, False
        if threading.current_thread() is not threading.main_thread():
            rank_zero_warn("Preemption: not in the main thread, signals are not handled")
            return
        self._previous = {sig: signal.signal(sig, self._handle) for sig in self.signals}

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self.signal_name is None or self._saved:
            return
        path = save_last(trainer)
        self._saved = True
        trainer._signal_connector.received_sigterm = (
            True  # Lightning's own (private) stop-after-this-step flag
        )
        if trainer.is_global_zero:
            print(
                f"{self.signal_name} at step {trainer.global_step}: saved {path}; stopping "
                f"(relaunch with resume=auto to continue)",
                file=sys.stdout,
                flush=True,
            )

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._restore()

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        self._restore()

    def _restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}


__all__ = ["DEFAULT_SIGNALS", "Preemption"]
