"""RNG states in checkpoints, so a resumed run draws the same random numbers as an uninterrupted one."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch
from lightning.pytorch.callbacks import Callback


class RngState(Callback):
    """Saves and restores the torch (CPU and CUDA), numpy and python RNG states with each checkpoint.

    On a GPU, the generator of the device this process trains on (``cuda_device``), restored to the device the
    resumed process trains on: a run resumes on a machine with any number of visible GPUs. Checkpoints are written
    by rank 0, and every rank of a run starts from one seed: each rank resumes from rank 0's states. (Checkpoints
    before 2026-11-29 kept every visible device's generator, ``cuda``: the first, rank 0's own, is restored; restoring
    them all failed on a machine with fewer GPUs, and gave rank ``r`` rank 0's copy of device ``r``'s generator, never
    drawn from.)"""

    def state_dict(self) -> dict[str, Any]:
        state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            state["cuda_device"] = torch.cuda.get_rng_state()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        torch.set_rng_state(state_dict["torch"])
        np.random.set_state(state_dict["numpy"])
        random.setstate(state_dict["python"])
        cuda = state_dict.get("cuda_device", (state_dict.get("cuda") or [None])[0])
        if cuda is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state(cuda)
