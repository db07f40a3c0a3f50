"""Probes of the paper step's host work on a CPU (twenty-ninth session; docs/benchmarks.md, 2026-11-30 "The host's
share measured in the next check"): Lightning callbacks added to a ``train.py`` run of ``experiment=enwik8_paper`` at
tiny widths (48 GAUs, compiled blocks), so the step's arithmetic is small and what is left is the host's work.

- ``Timing``: wall-clock ms per step over steps 20..30 (this session's machine: 218 to 338 from run to run);
- ``Guards``: the warm check time of each cache entry of a block's compiled forward (dynamo's guards), with the
  arguments a block gets at step 30;
- ``Outside``: the top-level ATen ops a step runs outside the compiled regions and the optimiser (steps 30, 31).

    for probe in Timing Guards Outside; do
      PYTHONPATH=docs/step_analysis/2026-11-30 TVQ_DATA_DIR=../shared/datasets OMP_NUM_THREADS=1 \\
        .venv/bin/python train.py experiment=enwik8_paper trainer=cpu trainer.devices=1 global_batch_size=null \\
        data=kjv data.batch_size=1 data.eval_batch_size=1 model.d_model=32 model.block.d_k=16 block_len=32 \\
        codebook_size=32 data.seq_len=128 data.sequence_len=512 module.compile=true module.position_bucket_len=32 \\
        trainer.max_steps=34 trainer.val_check_interval=1000000 trainer.limit_val_batches=1 logger=csv \\
        trainer.enable_progress_bar=false +callbacks.probe._target_=host_step_probes.$probe \\
        +callbacks.probe.out=/tmp/$probe.txt hydra.run.dir=/tmp/probe_$probe
    done
"""

from __future__ import annotations

import collections
import time
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback
from torch._dynamo.eval_frame import _debug_get_cache_entry_list
from torch.profiler import ProfilerActivity, profile


class Timing(Callback):
    """Wall-clock ms per step over steps ``t0..t1`` into ``out``."""

    def __init__(self, out: str, t0: int = 20, t1: int = 30) -> None:
        self.out, self.t0, self.t1, self.start = Path(out), t0, t1, 0.0

    def on_train_batch_start(self, trainer: L.Trainer, module: Any, batch: Any, idx: int) -> None:
        if trainer.global_step == self.t0:
            self.start = time.perf_counter()
        elif trainer.global_step == self.t1:
            ms = (time.perf_counter() - self.start) / (self.t1 - self.t0) * 1e3
            self.out.write_text(f"{ms:.1f} ms a step (steps {self.t0}..{self.t1})\n")


class Guards(Callback):
    """The warm guard check of every cache entry of a block's compiled forward, with the arguments the first block
    gets at step ``t0``, into ``out``."""

    def __init__(self, out: str, t0: int = 30) -> None:
        self.out, self.t0, self.args = Path(out), t0, None

    def on_train_batch_start(self, trainer: L.Trainer, module: Any, batch: Any, idx: int) -> None:
        if trainer.global_step == self.t0:
            decoder, block = module.model, type(module.model)._block

            def grab(this: Any, blk: Any, x: Any, state: Any) -> Any:
                if self.args is None:
                    self.args = (blk, x, state)
                return block(this, blk, x, state)

            decoder._block = grab.__get__(decoder)

    def on_train_batch_end(self, trainer: L.Trainer, module: Any, out: Any, batch: Any, idx: int) -> None:
        if trainer.global_step != self.t0 + 1 or self.args is None:
            return
        blk, x, state = self.args
        scope, lines = {"self": blk, "x": x, "state": state}, []
        for i, entry in enumerate(_debug_get_cache_entry_list(type(blk).forward.__code__)):
            passes = entry.guard_manager.check(scope)
            start = time.perf_counter()
            for _ in range(200):
                entry.guard_manager.check(scope)
            us = (time.perf_counter() - start) / 200 * 1e6
            lines.append(f"entry {i}: passes {passes}, warm check {us:.1f} us")
        self.out.write_text("\n".join(lines) + "\n")


class Outside(Callback):
    """Top-level ATen ops per step outside compiled regions and the optimiser (steps ``t0..t1 - 1``), into ``out``."""

    MARKS = ("Torch-Compiled Region", "## Call CompiledFxGraph", "CompiledFunction", "Optimizer.step")

    def __init__(self, out: str, t0: int = 30, t1: int = 32) -> None:
        self.out, self.t0, self.t1, self.profiler = Path(out), t0, t1, None

    def on_train_batch_start(self, trainer: L.Trainer, module: Any, batch: Any, idx: int) -> None:
        if trainer.global_step == self.t0:
            self.profiler = profile(activities=[ProfilerActivity.CPU])
            self.profiler.__enter__()

    def on_train_batch_end(self, trainer: L.Trainer, module: Any, out: Any, batch: Any, idx: int) -> None:
        if self.profiler is None or trainer.global_step < self.t1:
            return
        self.profiler.__exit__(None, None, None)
        steps, outside, inside = self.t1 - self.t0, collections.Counter(), collections.Counter()
        for event in self.profiler.events():
            if not event.name.startswith("aten::"):
                continue
            parents, parent = [], event.cpu_parent
            while parent is not None:
                parents.append(parent.name)
                parent = parent.cpu_parent
            if any(p.startswith("aten::") for p in parents):
                continue  # an op inside another op
            compiled = any(p.startswith(self.MARKS) for p in parents)
            (inside if compiled else outside)[event.name] += 1
        rows = [f"top-level ATen ops a step: {sum(outside.values()) / steps:.0f} outside the compiled regions and the "
                f"optimiser, {sum(inside.values()) / steps:.0f} inside"]  # fmt: skip
        rows += [f"{n / steps:8.1f} {name}" for name, n in outside.most_common(15)]
        self.out.write_text("\n".join(rows) + "\n")
        self.profiler = None
