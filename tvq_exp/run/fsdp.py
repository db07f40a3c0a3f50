"""``trainer=fsdp``: Lightning's ``ModelParallelStrategy`` (FSDP2) with the decoder sharded per block."""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.strategies import ModelParallelStrategy
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from tvq_exp.models.decoder import Decoder
from tvq_exp.models.sharding import DTYPES, shard_decoder
from tvq_exp.options import OptionError
from tvq_exp.run.checkpoints import AtomicCheckpointIO, CheckpointError

METADATA_FILE = "meta.pt"  # Lightning's: everything of a sharded checkpoint but the weights and optimisers


class BlockFSDPStrategy(ModelParallelStrategy):
    """Fully sharded data parallel over every process (no tensor parallelism), one FSDP unit per block.

    Args:
        param_dtype, reduce_dtype: compute and gradient-reduction dtypes (``fp32``, ``bf16``, ``fp16``);
            mixed precision lives here, so run it with ``trainer.precision=32-true``.
        activation_checkpointing: recompute each block's activations in the backward pass.
        save_distributed_checkpoint: ``True``: each rank writes its shard (a checkpoint is a folder;
            ``python -m tvq_exp.run.fsdp convert FOLDER FILE`` makes one file for ``eval.py``/``sample.py``);
            ``False``: rank 0 gathers the full state into one ``.ckpt`` file (what ``resume=auto`` reads).
        **kwargs: ``ModelParallelStrategy``'s other arguments (``process_group_backend``, ``timeout``).
    """

    def __init__(
        self,
        param_dtype: str = "bf16",
        reduce_dtype: str = "fp32",
        activation_checkpointing: bool = True,
        save_distributed_checkpoint: bool = False,
        **kwargs: Any,
    ) -> None:
        for name, value in {"param_dtype": param_dtype, "reduce_dtype": reduce_dtype}.items():
            if value not in DTYPES:
                raise OptionError(f"trainer.strategy.{name}", value, f"must be one of {sorted(DTYPES)}")
        super().__init__(
            data_parallel_size="auto",
            tensor_parallel_size=1,
            save_distributed_checkpoint=save_distributed_checkpoint,
            **kwargs,
        )
        self.param_dtype, self.reduce_dtype = param_dtype, reduce_dtype
        self.activation_checkpointing = activation_checkpointing

    def setup_environment(self) -> None:
        self._data_parallel_size = (
            self.num_nodes * self.num_processes
        )  # all processes shard one model (no tensor parallelism)
        super().setup_environment()

    def parallelize(self, decoder: Decoder) -> Decoder:
        """Shard ``decoder`` over the data-parallel mesh (called from the module's ``configure_model``)."""
        return shard_decoder(
            decoder,
            self.device_mesh["data_parallel"],
            self.param_dtype,
            self.reduce_dtype,
            self.activation_checkpointing,
        )


def consolidate(folder: str | os.PathLike[str], output: str | os.PathLike[str]) -> Path:
    """Turn a sharded checkpoint (a folder written with ``save_distributed_checkpoint=true``) into one
    ``.ckpt`` file that ``eval.py``, ``sample.py`` and ``init_from`` read (one process, no process group)."""
    folder, output = Path(folder), Path(output)
    meta = folder / METADATA_FILE
    if not (folder.is_dir() and meta.is_file()):
        raise CheckpointError(
            f"{folder} is not a sharded checkpoint (a folder with {METADATA_FILE} and .distcp files)"
        )
    with tempfile.TemporaryDirectory() as tmp:
        gathered = Path(tmp) / "state.pt"
        dcp_to_torch_save(folder, gathered)
        state = torch.load(gathered, map_location="cpu", weights_only=False)
    checkpoint = torch.load(meta, map_location="cpu", weights_only=False)
    checkpoint["state_dict"] = state.pop("state_dict")
    optimizers = sorted(k for k in state if k.startswith("optimizer_"))
    checkpoint["optimizer_states"] = [state.pop(k) for k in optimizers]
    AtomicCheckpointIO().save_checkpoint(checkpoint, output)
    return output


def main(argv: list[str] | None = None) -> None:
    """``python -m tvq_exp.run.fsdp convert FOLDER FILE``."""
    parser = argparse.ArgumentParser(prog="python -m tvq_exp.run.fsdp", description=consolidate.__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    convert = commands.add_parser("convert", help="a sharded checkpoint folder -> one .ckpt file")
    convert.add_argument("folder")
    convert.add_argument("output")
    args = parser.parse_args(argv)
    try:
        print(f"wrote {consolidate(args.folder, args.output)}")
    except CheckpointError as err:
        raise SystemExit(f"error: {err}") from None


if __name__ == "__main__":
    main()
