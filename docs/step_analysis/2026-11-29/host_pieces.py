"""Host time of the paper step's per-step bookkeeping outside the model, on CPU: ``experiment=enwik8_paper``'s 48
GAUs at tiny widths (as ``docs/step_analysis/2026-11-28/host_ops.py``), each piece timed alone (mean of 200 calls,
ms): listing the parameters (the finiteness verdict and the clipping each do), the quantisers and their parameters'
ids (the clipping), moving the carried state to the batch's device as Lightning does (``move_data_to_device``) and
as the step does now (:func:`~tvq_exp.models.module.state_on`: not at all where it is there), and cleaning and
detaching it.

Run from the repository root: ``TVQ_DATA_DIR=../shared/datasets .venv/bin/python
docs/step_analysis/2026-11-29/host_pieces.py``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from hydra.utils import instantiate
from lightning.fabric.utilities.apply_func import move_data_to_device

sys.path.insert(0, str(Path.cwd()))
from tests.helpers.config import compose_config  # noqa: E402
from tvq_exp.models.decoder import detach_state  # noqa: E402
from tvq_exp.models.module import finite_state, state_on  # noqa: E402

SHAPE = [
    "experiment=enwik8_paper", "trainer=cpu", "trainer.devices=1", "global_batch_size=null", "data=kjv",
    "data.batch_size=2", "data.seq_len=64", "data.sequence_len=256", "block_len=16", "codebook_size=16",
    "model.d_model=32", "model.block.d_k=16",
]  # fmt: skip


def ms(call: Callable[[], object], n: int = 200) -> float:
    call()
    start = time.perf_counter()
    for _ in range(n):
        call()
    return (time.perf_counter() - start) / n * 1e3


def main() -> None:
    torch.manual_seed(0)
    model = instantiate(compose_config("train", SHAPE).model)
    state = model(torch.randint(0, 256, (2, 64)), None).state
    cpu = torch.device("cpu")
    pieces = {
        "list the parameters": lambda: list(model.parameters()),
        "the quantisers' parameter ids": lambda: {id(p) for q in model.quantizers() for p in q.parameters()},
        "move the state (Lightning's move_data_to_device)": lambda: move_data_to_device(state, cpu),
        "move the state (state_on, already there)": lambda: state_on(state, cpu),
        "clean the state (finite_state)": lambda: finite_state(state),
        "detach the state (detach_state)": lambda: detach_state(state),
    }
    print(f"{len(state)} blocks, {sum(len(s.tensors()) for s in state)} state tensors; ms per call:")
    for name, call in pieces.items():
        print(f"  {ms(call):7.3f}  {name}")


if __name__ == "__main__":
    main()
