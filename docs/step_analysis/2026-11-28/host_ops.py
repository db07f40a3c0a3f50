"""The paper step's fixed host work, on CPU: ``experiment=enwik8_paper``'s 48 GAUs and TBPTT shape with tiny widths
(``d_model`` 32, ``d_k`` 16, ``L = S`` 16, 64-token updates, batch 2), compiled by blocks as on a GPU, so that the
step's time is nearly all the host's: Python, the dispatcher, one call per op. Prints the median step time of the
throughput callback's rows (after the first: compilation) and the aten ops per step that no compiled block
contains (each one a kernel launch on a GPU unless it is a view), counted by torch.profiler over steps 40..42.

Run from the repository root: ``.venv/bin/python docs/step_analysis/2026-11-28/host_ops.py`` (about 2 minutes).
"""

from __future__ import annotations

import collections
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SHAPE = [
    "experiment=enwik8_paper", "trainer=cpu", "trainer.devices=1", "global_batch_size=null", "data=kjv",
    "data.batch_size=2", "data.seq_len=64", "data.sequence_len=256", "block_len=16", "codebook_size=16",
    "model.d_model=32", "model.block.d_k=16", "module.compile=true", "trainer.max_steps=120",
    "trainer.val_check_interval=1000000", "trainer.limit_val_batches=1", "trainer.check_val_every_n_epoch=null",
    "trainer.log_every_n_steps=10", "logger=csv", "trainer.enable_progress_bar=false",
    "++logger.csv.flush_logs_every_n_steps=10", "print_config=false",
]  # fmt: skip


def _callback() -> type:
    from lightning.pytorch.callbacks import Callback
    from torch.profiler import ProfilerActivity, profile

    class OpsPerStep(Callback):
        """Top-level aten ops per step over optimiser steps ``skip .. skip + steps - 1``, split by whether a compiled
        region encloses them, written to ``out`` as JSON."""

        def __init__(self, out: str, skip: int = 40, steps: int = 3) -> None:
            self.out, self.skip, self.steps, self.prof = out, skip, steps, None

        def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, idx: int) -> None:
            if trainer.global_step == self.skip and self.prof is None:
                self.prof = profile(activities=[ProfilerActivity.CPU])
                self.prof.__enter__()

        def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, idx: int) -> None:
            if self.prof is None or trainer.global_step != self.skip + self.steps:
                return
            self.prof.__exit__(None, None, None)
            counts: dict[str, collections.Counter] = {
                "eager": collections.Counter(),
                "compiled": collections.Counter(),
            }
            for event in self.prof.events():
                if not event.name.startswith("aten::"):
                    continue
                parent, compiled = event.cpu_parent, False
                while parent is not None and not parent.name.startswith("aten::"):
                    compiled |= "Compiled" in parent.name
                    parent = parent.cpu_parent
                if parent is None:  # a top-level op (the ops it calls are its own)
                    counts["compiled" if compiled else "eager"][event.name] += 1
            per_step = {k: {n: c / self.steps for n, c in v.most_common()} for k, v in counts.items()}
            Path(self.out).write_text(json.dumps(per_step, indent=1))
            self.prof = None

    return OpsPerStep


OpsPerStep = _callback() if __name__ != "__main__" else None


def main() -> None:
    repo = Path.cwd()
    with tempfile.TemporaryDirectory() as tmp:
        ops = Path(tmp) / "ops.json"
        env = {**os.environ, "PYTHONPATH": f"{HERE}{os.pathsep}{repo}", "TVQ_DATA_DIR": os.environ.get(
            "TVQ_DATA_DIR", str(repo.parent / "shared" / "datasets"))}  # fmt: skip
        args = [*SHAPE, f"hydra.run.dir={tmp}/run", "+callbacks.ops._target_=host_ops.OpsPerStep",
                f"+callbacks.ops.out={ops}"]  # fmt: skip
        done = subprocess.run(
            [sys.executable, "train.py", *args], cwd=repo, env=env, capture_output=True, text=True
        )
        if done.returncode:
            sys.exit(done.stderr[-3000:])
        print(done.stdout.strip().splitlines()[-1])
        rows = [r for r in (Path(tmp) / "run" / "csv" / "metrics.csv").read_text().splitlines()[1:]]
        header = (Path(tmp) / "run" / "csv" / "metrics.csv").read_text().splitlines()[0].split(",")
        col = header.index("throughput/step_time_ms")
        times = [float(r.split(",")[col]) for r in rows if r.split(",")[col]]
        print(f"step time, ms (rows of 10 steps): {[round(t, 1) for t in times]}; median after the first: "
              f"{statistics.median(times[1:]):.1f}")  # fmt: skip
        per_step = json.loads(ops.read_text())
        for kind in ("eager", "compiled"):
            total = sum(per_step[kind].values())
            top = ", ".join(
                f"{n.removeprefix('aten::')} {c:.0f}" for n, c in list(per_step[kind].items())[:12]
            )
            print(f"{kind} top-level aten ops per step: {total:.0f} ({top})")


if __name__ == "__main__":
    main()
