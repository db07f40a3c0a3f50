"""FSDP2 for the decoder: one shard group per block plus the root (embeddings, final norm, head).

``shard_decoder`` is what ``trainer=fsdp`` applies (through :class:`tvq_exp.run.fsdp.BlockFSDPStrategy`
and the Lightning module's ``configure_model``). Parameters become ``DTensor`` shards over the data-parallel
mesh; each block's are gathered for its forward and backward and freed after. Buffers (VQ codebooks, their
EMA statistics) are not sharded: every rank keeps the whole codebook and the all-reduced update of
:meth:`~tvq_exp.quantize.codebook.VectorQuantizer.update` keeps the copies identical, as under DDP.
"""

from __future__ import annotations

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

from tvq_exp.models.decoder import Decoder

DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def shard_decoder(
    decoder: Decoder,
    mesh: DeviceMesh,
    param_dtype: str = "fp32",
    reduce_dtype: str = "fp32",
    activation_checkpointing: bool = False,
) -> Decoder:
    """Shard ``decoder`` in place (idempotent) and return it.

    Args:
        mesh: the 1-D data-parallel device mesh.
        param_dtype: dtype the gathered parameters are cast to for compute (``bf16`` = mixed precision);
            the sharded master weights and the optimiser state stay fp32.
        reduce_dtype: dtype of the gradient reduce-scatter.
        activation_checkpointing: recompute each block's activations in the backward pass.
    """
    for name, value in {"param_dtype": param_dtype, "reduce_dtype": reduce_dtype}.items():
        if value not in DTYPES:
            raise ValueError(f"{name}={value!r} is not one of {sorted(DTYPES)}")
    if isinstance(decoder, FSDPModule):
        return decoder
    policy = MixedPrecisionPolicy(param_dtype=DTYPES[param_dtype], reduce_dtype=DTYPES[reduce_dtype])
    decoder.activation_checkpointing = activation_checkpointing
    for block in decoder.blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(decoder, mesh=mesh, mp_policy=policy)
    return decoder


def is_sharded(module: torch.nn.Module) -> bool:
    """Whether ``module`` is FSDP-sharded: then every forward is a collective, run on all ranks together."""
    return isinstance(module, FSDPModule)
