"""``trainer=fsdp``: Lightning's ``ModelParallelStrategy`` (FSDP2) with the decoder sharded per block."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.strategies import ModelParallelStrategy

from tvq_exp.models.decoder import Decoder
from tvq_exp.models.sharding import DTYPES, shard_decoder
from tvq_exp.options import OptionError
from tvq_exp.run.checkpoints import (
    PARAM_GROUPS,
    SHARDED_METADATA,
    AtomicCheckpointIO,
    CheckpointError,
    gather_checkpoint,
    is_sharded,
    previous_path,
    read_checkpoint,
    remove_checkpoint,
)
from tvq_exp.run.safe_load import SAFE_GLOBALS


class BlockFSDPStrategy(ModelParallelStrategy):
    """Fully sharded data parallel over every process (no tensor parallelism), one FSDP unit per block.

    Args:
        param_dtype, reduce_dtype: compute and gradient-reduction dtypes (``fp32``, ``bf16``, ``fp16``);
            mixed precision lives here, so run it with ``trainer.precision=32-true``.
        activation_checkpointing: recompute each block's activations in the backward pass.
        save_distributed_checkpoint: ``True``: each rank writes its shard (a checkpoint is a folder, written
            atomically like the files: into a hidden folder, then renamed, the one it replaces kept as
            ``.prev``; ``resume=auto``, ``ckpt_path``, ``eval.py`` and ``sample.py`` read it, and
            ``python -m tvq_exp.run.fsdp convert FOLDER FILE`` makes one file); ``False``: rank 0 gathers
            the full state into one ``.ckpt`` file.
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

    def save_checkpoint(
        self, checkpoint: dict[str, Any], filepath: str | os.PathLike[str], storage_options: Any | None = None
    ) -> None:
        """A sharded save goes to a hidden staging folder first; rank 0 then keeps the checkpoint it replaces
        as ``<stem>.prev.ckpt`` and renames the staging folder into place: a checkpoint is whole or absent."""
        if not self._save_distributed_checkpoint:
            return super().save_checkpoint(checkpoint, filepath, storage_options)
        path = Path(self.broadcast(str(filepath)))
        staging = path.with_name(f".{path.name}.tmp")
        states = checkpoint.get("optimizer_states", [])  # tensors to the shards, plain values to meta.pt
        checkpoint[PARAM_GROUPS] = [state["param_groups"] for state in states]
        checkpoint["optimizer_states"] = [{"state": state["state"]} for state in states]
        if self.global_rank == 0:
            remove_checkpoint(staging)  # what a save killed half-way left
        self.barrier("sharded_save_staging")
        super().save_checkpoint(checkpoint, staging, storage_options)
        self.barrier("sharded_save_written")
        if self.global_rank == 0:
            if path.exists():
                remove_checkpoint(previous_path(path))
                os.replace(path, previous_path(path))
            os.replace(staging, path)
        self.barrier("sharded_save_done")

    def load_checkpoint(
        self, checkpoint_path: str | os.PathLike[str], weights_only: bool | None = None
    ) -> dict[str, Any]:
        """Load a sharded or single-file checkpoint: it is first checked as
        :func:`~tvq_exp.run.checkpoints.read_checkpoint` checks every checkpoint of ours (a sharded one's index
        names tensors only, before any shard is read); a file is then read by Lightning ``weights_only``
        (:mod:`tvq_exp.run.safe_load`), a folder's shards into this rank's weights and optimiser moments, its
        optimisers' plain values from ``meta.pt`` (:meth:`save_checkpoint` put them there)."""
        path = Path(self.broadcast(str(checkpoint_path)))
        checkpoint = read_checkpoint(path)
        if not is_sharded(path):
            with torch.serialization.safe_globals(SAFE_GLOBALS):
                return super().load_checkpoint(path, weights_only=True)
        from torch.distributed.checkpoint import load  # noqa: PLC0415 - a sharded resume only
        from torch.distributed.checkpoint.state_dict import (  # noqa: PLC0415
            StateDictOptions,
            get_model_state_dict,
            get_optimizer_state_dict,
            set_optimizer_state_dict,
        )

        weights = {"state_dict": get_model_state_dict(self.model)}
        load(weights, checkpoint_id=path)
        self.model.load_state_dict(weights["state_dict"], strict=self.lightning_module.strict_loading)
        groups = checkpoint.pop(PARAM_GROUPS, [])
        for index, optimizer in enumerate(self.optimizers):
            moments = {
                f"optimizer_{index}": {"state": get_optimizer_state_dict(self.model, optimizer)["state"]}
            }
            load(moments, checkpoint_id=path)
            state = {**moments[f"optimizer_{index}"], "param_groups": groups[index]}
            set_optimizer_state_dict(
                self.model, optimizer, optim_state_dict=state, options=StateDictOptions(cpu_offload=True)
            )
        checkpoint.pop("state_dict", None)
        checkpoint.pop("optimizer_states", None)
        return checkpoint

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
    if not is_sharded(folder):
        raise CheckpointError(
            f"{folder} is not a sharded checkpoint (a folder with {SHARDED_METADATA} and .distcp files)"
        )
    AtomicCheckpointIO().save_checkpoint(gather_checkpoint(folder), output)
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
