"""RNG states in checkpoints, so a resumed run draws the same random numbers as an uninterrupted one."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch
from lightning.pytorch.callbacks import Callback


class RngState(Callback):
    """Saves and restores the torch (CPU and CUDA), numpy and python RNG states with each checkpoint."""

    def state_dict(self) -> dict[str, Any]:
        state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            state["cuda"] = torch.cuda.get_rng_state_all()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        torch.set_rng_state(state_dict["torch"])
        np.random.set_state(state_dict["numpy"])
        random.setstate(state_dict["python"])
        if "cuda" in state_dict and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state_dict["cuda"])
