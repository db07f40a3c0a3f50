"""The codebook invariant under DDP, checked: at the end of training every rank hashes its codebooks (every
quantiser buffer that persists in the checkpoint); the hashes are gathered and written to
``<run dir>/codebook_sync.json``. Different hashes (a broken invariant of docs/design.md) raise.
(Lightning DDP does the distributing; this only verifies it.)"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import Callback

SYNC_FILE = "codebook_sync.json"


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
    (rank 0) and raise if they differ. Does nothing for models without quantisers or in a single process
    (nothing to compare).

    Args:
        output_dir: the run directory.
    """

    def __init__(self, output_dir: str) -> None:
        self.output_dir = Path(output_dir)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        model = getattr(pl_module, "model", pl_module)
        if trainer.world_size < 2 or not codebook_state(model):
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


__all__ = ["CodebookSync", "codebook_digest", "codebook_state", "gather_objects"]
