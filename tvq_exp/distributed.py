"""Distributed-training checks (Lightning DDP does the distributing; we only verify its invariants).

- :func:`global_batch_size` and :class:`GlobalBatchSize`: the global batch is the per-device batch ×
  devices × nodes × gradient accumulation. The callback prints it on rank 0 and, when the config states
  ``global_batch_size``, refuses to train with a different one.
- :class:`CodebookSync`: at the end of training every rank hashes its codebooks (every quantiser
  buffer that persists in the checkpoint); the hashes are gathered and written to
  ``<run dir>/codebook_sync.json``. Different hashes (a broken invariant of DESIGN.md section 3) raise.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.rank_zero import rank_zero_only

SYNC_FILE = "codebook_sync.json"


def global_batch_size(per_device: int, world_size: int, accumulation: int) -> int:
    """Sequences per optimiser step over all processes: ``per_device × world_size × accumulation``."""
    return int(per_device) * int(world_size) * int(accumulation)


def trainer_global_batch(trainer: L.Trainer, per_device: int) -> int:
    """The global batch of ``trainer`` (``world_size`` counts devices × nodes)."""
    return global_batch_size(per_device, trainer.world_size, trainer.accumulate_grad_batches)


class GlobalBatchSize(Callback):
    """Print the global batch at the start of ``fit``; check it against ``expected`` when given.

    Args:
        per_device: the data module's (per-process) batch size.
        expected: the global batch the config states (``null``: not checked).
    """

    def __init__(self, per_device: int, expected: int | None = None) -> None:
        self.per_device, self.expected = int(per_device), expected

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        actual = trainer_global_batch(trainer, self.per_device)
        if self.expected is not None and actual != int(self.expected):
            raise ValueError(
                f"global batch {actual} = data.batch_size {self.per_device} x {trainer.world_size} processes "
                f"x accumulate_grad_batches {trainer.accumulate_grad_batches}, but the config states "
                f"global_batch_size={self.expected}: change data.batch_size, trainer.devices/num_nodes or "
                "trainer.accumulate_grad_batches"
            )
        say(
            f"global batch {actual} sequences = {self.per_device} per device x {trainer.world_size} processes "
            f"x {trainer.accumulate_grad_batches} accumulation"
        )


@rank_zero_only
def say(message: str) -> None:
    """Print one line on rank 0."""
    print(message, file=sys.stdout, flush=True)


def codebook_digest(module: torch.nn.Module) -> bytes:
    """SHA-256 over every persistent buffer and parameter of every vector quantiser in ``module``."""
    digest = hashlib.sha256()
    for name, tensor in sorted(codebook_state(module).items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.digest()


def codebook_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``{qualified name: tensor}`` of the quantisers' checkpointed state (empty for non-VQ models)."""
    quantizers = getattr(module, "quantizers", None)
    if quantizers is None:
        return {}
    names = {id(q): name for name, q in module.named_modules()}
    return {f"{names[id(q)]}.{key}": value for q in quantizers() for key, value in q.state_dict().items()}


def gather_objects(value: Any) -> list[Any]:
    """``value`` of every rank, in rank order (``[value]`` without an initialised process group)."""
    if not (dist.is_available() and dist.is_initialized()):
        return [value]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value)
    return gathered


class CodebookSync(Callback):
    """Gather every rank's codebook hash at the end of training; write them to ``<output_dir>/codebook_sync.json``
    (rank 0) and raise if they differ. Does nothing for models without quantisers.

    Args:
        output_dir: the run directory.
    """

    def __init__(self, output_dir: str) -> None:
        self.output_dir = Path(output_dir)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        model = getattr(pl_module, "model", pl_module)
        if not codebook_state(model):
            return
        hashes = gather_objects(codebook_digest(model).hex())
        report = {"world_size": trainer.world_size, "global_step": trainer.global_step, "hashes": hashes}
        report["identical"] = len(set(hashes)) == 1
        if trainer.is_global_zero:
            self.write(report)
        if not report["identical"]:
            raise RuntimeError(f"codebooks differ across ranks after step {trainer.global_step}: {hashes}")

    def write(self, report: dict[str, Any]) -> None:
        """Write the report as JSON."""
        self.output_dir.mkdir(parents=True, exist_ok=True)
        (self.output_dir / SYNC_FILE).write_text(json.dumps(report, indent=2) + "\n")


__all__ = ["CodebookSync", "GlobalBatchSize", "codebook_digest", "global_batch_size", "trainer_global_batch"]
