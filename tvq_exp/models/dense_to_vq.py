"""Dense -> VQ fine-tuning: load a dense checkpoint into a VQ model and k-means-initialise its codebooks (into a
model without quantisers, e.g. dense again: the weights alone, a fine-tuning start)."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from tvq_exp.models.decoder import Decoder
from tvq_exp.quantize.codebook import VectorQuantizer

MODEL_PREFIX = "model."


def dense_weights(checkpoint: Mapping[str, Any]) -> dict[str, Tensor]:
    """The decoder weights of a Lightning checkpoint (``model.`` prefix removed), or of a bare state dict."""
    state = checkpoint.get("state_dict", checkpoint)
    if any(k.startswith(MODEL_PREFIX) for k in state):
        return {k[len(MODEL_PREFIX) :]: v for k, v in state.items() if k.startswith(MODEL_PREFIX)}
    return dict(state)


def quantizer_prefixes(model: nn.Module) -> tuple[str, ...]:
    """Qualified names (with a trailing dot) of every :class:`VectorQuantizer` in ``model``."""
    return tuple(f"{name}." for name, m in model.named_modules() if isinstance(m, VectorQuantizer))


def load_dense_weights(model: Decoder, weights: Mapping[str, Tensor]) -> None:
    """Copy ``weights`` into ``model``: every non-quantiser entry must be present with the same shape and
    every dense weight must be used; the quantisers' parameters and buffers are left as they are."""
    skip = quantizer_prefixes(model)
    own = {k: v for k, v in model.state_dict().items() if not k.startswith(skip)}
    missing = sorted(set(own) - set(weights))
    unexpected = sorted(set(weights) - set(own))
    mismatched = sorted(k for k in set(own) & set(weights) if own[k].shape != weights[k].shape)
    if missing or unexpected or mismatched:
        raise ValueError(
            "the dense checkpoint does not match the VQ model outside the quantisers: "
            f"missing {missing}, unexpected {unexpected}, shape mismatch {mismatched}"
        )
    model.load_state_dict({k: weights[k] for k in own}, strict=False)


@torch.no_grad()
def collect_keys(model: Decoder, batches: Iterable[Mapping[str, Tensor]]) -> list[Tensor]:
    """Keys reaching every block's attention (``blk.attn(q, k, v, state)``) over ``batches``, in eval mode.

    Returns one ``(H_kv, N, d_k)`` fp32 tensor per block (``N`` = all positions of all batches).
    """
    collected: list[list[Tensor]] = [[] for _ in model.blocks]
    hooks = []
    for i, block in enumerate(model.blocks):

        def grab(module: nn.Module, args: tuple[Any, ...], i: int = i) -> None:
            k = args[1]  # (B, H, T, d_k)
            collected[i].append(k.detach().float().transpose(0, 1).reshape(k.shape[1], -1, k.shape[-1]))

        hooks.append(block.attn.register_forward_pre_hook(grab))
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    try:
        for batch in batches:
            model(batch["input"].to(device))
    finally:
        for hook in hooks:
            hook.remove()
        model.train(was_training)
    if not collected[0]:
        raise ValueError("no batches to collect keys from")
    return [torch.cat(keys, dim=1) for keys in collected]


def init_codebooks(model: Decoder, batches: Iterable[Mapping[str, Tensor]]) -> None:
    """k-means-initialise every block's codebook from keys the model produces on ``batches``."""
    keys = collect_keys(model, batches)
    for block, block_keys in zip(model.blocks, keys, strict=True):
        quantizer = getattr(block.attn, "quantizer", None)
        if not isinstance(quantizer, VectorQuantizer):
            raise ValueError(
                f"{type(block.attn).__name__} has no vector quantiser: init_from needs a VQ model"
            )
        quantizer.init_from_keys(block_keys)


def init_from_dense(
    model: Decoder, checkpoint: Mapping[str, Any], batches: Iterable[Mapping[str, Tensor]], num_batches: int
) -> None:
    """Convert ``model`` (VQ) from a dense ``checkpoint`` (loaded ``weights_only`` by
    :func:`tvq_exp.run.checkpoints.read_weights`): load its weights, then initialise the codebooks by k-means
    over the keys of the first ``num_batches`` of ``batches``. A model with no quantiser (dense again, FLASH)
    takes the weights alone, under the same rule: the same start for a control that fine-tunes without VQ."""
    load_dense_weights(model, dense_weights(checkpoint))
    if quantizer_prefixes(model):
        init_codebooks(model, itertools.islice(batches, num_batches))
