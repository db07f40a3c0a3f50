"""The decoder: token embeddings -> N residual blocks -> norm -> logits, with streaming state."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from tvq_exp.attention.base import AttentionBackend
from tvq_exp.measure.flops import mm, with_backward
from tvq_exp.models.blocks.common import BlockState, ResidualBlock
from tvq_exp.models.init import official_init
from tvq_exp.nn.norms import RMSNorm
from tvq_exp.options import AtLeast, Between, OneOf, PositiveFloat, PositiveInt, checked
from tvq_exp.quantize.codebook import VectorQuantizer, statistics_frozen

ModelState = list[BlockState]  # one per block
BlockFactory = Callable[..., nn.Module]


@dataclass
class DecoderOutput:
    """``logits (B, T, V)``; ``state`` per layer (pass back to continue); ``aux``: ``loss`` (sum of
    auxiliary losses over layers, a scalar tensor) and detached per-layer metrics ``layerN/name``."""

    logits: Tensor
    state: ModelState
    aux: dict[str, Tensor]


class Decoder(nn.Module):
    """Byte / sub-pixel decoder.

    Args:
        vocab_size: number of token ids (256 bytes; image levels + 1 BOS).
        d_model, n_layers: width and number of blocks.
        block: factory ``block(d_model=..., attention=...) -> nn.Module`` (a Hydra partial).
        attention: factory for the blocks' attention backends (a Hydra partial of ``build_attention``).
        tie_embeddings: share the embedding matrix with the output head (official ``e_tie``).
        final_norm: an RMS norm (gain and bias) before the head (official ``e_preln``).
        embed_dropout: dropout on the embeddings.
        pos_embedding: optional module mapping absolute positions ``(T,)`` to ``(T, d_model)``
            (images: row / column / channel embeddings).
        head_bias: an output bias (the official head always has one).
        embed_scale: embeddings start as ``N(0, 1/embed_scale²)`` and are looked up times ``embed_scale``,
            so the blocks see ``N(0, 1)`` inputs whatever the scale; a larger scale makes Adam move the
            embeddings faster. ``None``: ``sqrt(d_model)`` (learns markedly faster in small, short runs);
            the official code uses ``1`` (``N(0, 1)`` embeddings looked up as they are).
        logit_scale: multiplies the logits, bias included (official ``e_scale``); ``None``:
            ``embed_scale / d_model`` with tied embeddings (logits start at ``d_model^-1/2`` scale, near
            uniform), else 1.
        init: ``official`` (:func:`~tvq_exp.models.init.official_init`: linear kernels ``N(0, 1/fan_in)``)
            or ``torch`` (PyTorch's defaults).

    Shapes: ``tokens (B, T)`` -> ``DecoderOutput(logits (B, T, V), state, aux)``.
    """

    @checked
    def __init__(
        self,
        vocab_size: Annotated[int, AtLeast(2)],
        d_model: PositiveInt,
        n_layers: PositiveInt,
        block: BlockFactory,
        attention: Callable[..., AttentionBackend],
        tie_embeddings: bool = True,
        final_norm: bool = True,
        embed_dropout: Annotated[float, Between(0, 1, "[)")] = 0.0,
        pos_embedding: nn.Module | None = None,
        head_bias: bool = False,
        embed_scale: PositiveFloat | None = None,
        logit_scale: PositiveFloat | None = None,
        init: Annotated[str, OneOf("official", "torch")] = "official",
    ) -> None:
        super().__init__()
        self.vocab_size, self.d_model, self.n_layers = vocab_size, d_model, n_layers
        self.embed = nn.Embedding(vocab_size, d_model)
        self.pos_embedding = pos_embedding
        self.embed_dropout = nn.Dropout(embed_dropout)
        self.blocks = nn.ModuleList(block(d_model=d_model, attention=attention) for _ in range(n_layers))
        self.norm = RMSNorm(d_model) if final_norm else nn.Identity()
        self.head = nn.Linear(d_model, vocab_size, bias=head_bias)
        if init == "official":
            official_init(self)
        self.embed_scale = d_model**0.5 if embed_scale is None else embed_scale
        torch.nn.init.normal_(self.embed.weight, std=1.0 / self.embed_scale)
        if tie_embeddings:
            self.head.weight = self.embed.weight
        default_scale = self.embed_scale / d_model if tie_embeddings else 1.0
        self.logit_scale = default_scale if logit_scale is None else logit_scale
        self.activation_checkpointing = False  # set by tvq_exp.models.sharding.shard_decoder

    def forward(self, tokens: Tensor, state: ModelState | None = None) -> DecoderOutput:
        t0 = 0 if state is None else state[0].position
        x = self.embed(tokens) * self.embed_scale
        if self.pos_embedding is not None:
            x = x + self.pos_embedding(t0 + torch.arange(tokens.shape[1], device=tokens.device)).to(x.dtype)
        x = self.embed_dropout(x)
        new_state: ModelState = []
        losses: list[Tensor] = []
        metrics: dict[str, Tensor] = {}
        for i, blk in enumerate(self.blocks):
            x, s, aux = self._block(blk, x, None if state is None else state[i])
            new_state.append(s)
            for name, value in aux.items():
                if name.endswith("_loss"):
                    losses.append(value)
                metrics[f"layer{i}/{name}"] = value.detach()
        logits = self.head(self.norm(x)) * self.logit_scale
        return DecoderOutput(logits, new_state, {"loss": total_loss(losses, x.device), **metrics})

    def _block(
        self, blk: nn.Module, x: Tensor, state: BlockState | None
    ) -> tuple[Tensor, BlockState, dict[str, Tensor]]:
        """One block; with activation checkpointing (training) its activations are recomputed in the
        backward pass, with the codebook statistics frozen so the recomputation does not count them twice."""
        if not (self.activation_checkpointing and self.training and torch.is_grad_enabled()):
            return blk(x, state)
        contexts = lambda: (contextlib.nullcontext(), statistics_frozen())  # noqa: E731  (forward, recompute)
        return checkpoint(blk, x, state, use_reentrant=False, context_fn=contexts)

    def flops(self, seq_len: int, batch: int = 1, backward: bool = False) -> int | None:
        """Matmul FLOPs on ``batch`` fresh sequences of ``seq_len``: every block plus the output head
        ``2T·d_model·V`` (embeddings are lookups: free). With ``backward`` a whole training step's
        matmuls (the optimiser runs none). ``None`` when a block has no formula."""
        total = with_backward(batch * mm(seq_len, self.vocab_size, self.d_model), backward)
        for block in self.blocks:
            flops = block.flops(seq_len, batch, backward) if hasattr(block, "flops") else None
            if flops is None:
                return None
            total += flops
        return total

    def equivalent_position(self, t: int) -> int:
        """The position every block treats a carried state at ``t`` as (their
        :meth:`~tvq_exp.models.blocks.common.ResidualBlock.equivalent_position`, where all agree); ``t`` with absolute
        position embeddings, or blocks that differ or have none."""
        found = {
            block.equivalent_position(t) if isinstance(block, ResidualBlock) else t for block in self.blocks
        }
        return found.pop() if len(found) == 1 and self.pos_embedding is None else t

    def positions_repeat(self) -> bool:
        """Whether every carried position has an :meth:`equivalent_position` below some bound, so that code compiled
        with the carried position as a constant compiles a bounded number of times (the VQ, dense, linear and FLASH
        backends' states, OVQ's once its dictionary can fill); not with RoPE's rotations at absolute positions, absolute
        position embeddings, or an OVQ dictionary that never fills."""
        far = 2**62
        return self.equivalent_position(far) < far

    def state_floats(self, seq_len: int) -> int:
        """Size of the recurrent inference state per layer and sequence after ``seq_len`` positions (the mean
        over layers of each attention backend's :meth:`~tvq_exp.attention.base.AttentionBackend.state_floats`):
        what decoding carries from token to token, the recall probes' x axis. A block with ``key_smear`` also carries
        its last key (``H_kv·d_k`` floats), which is not counted."""
        sizes = [attn.state_floats(seq_len) for attn in self.attention_modules()]
        return sum(sizes) // max(1, len(sizes))

    def check_context(self, length: int) -> None:
        """Ask every attention backend whether its options fit contexts of ``length`` positions (raises
        :class:`~tvq_exp.options.OptionError`)."""
        for attn in self.attention_modules():
            attn.check_context(length)

    def attention_modules(self) -> list[AttentionBackend]:
        """The attention backend of every block, in order."""
        return [m for m in self.modules() if isinstance(m, AttentionBackend)]

    def quantizers(self) -> list[VectorQuantizer]:
        """Every vector quantiser in the model (empty for non-VQ models)."""
        return [m for m in self.modules() if isinstance(m, VectorQuantizer)]

    @torch.no_grad()
    def codebook_step(self, apply: Tensor | None = None) -> None:
        """Apply accumulated codebook statistics: call once per optimiser step (``apply``, a 0-d bool tensor:
        where False, nothing changes; see :meth:`~tvq_exp.quantize.VectorQuantizer.update`)."""
        for q in self.quantizers():
            q.update(apply)

    def discard_codebook_statistics(self) -> None:
        """Drop the codebook statistics gathered since the last :meth:`codebook_step` (a skipped step)."""
        for q in self.quantizers():
            q.discard_pending()


def total_loss(losses: list[Tensor], device: torch.device) -> Tensor:
    """The blocks' auxiliary losses (0-d tensors) summed in fp32, a 0-d tensor (0 without any): one stack and one sum
    however deep the model (between compiled blocks an add per layer is an eager launch each)."""
    if not losses:
        return torch.zeros((), dtype=torch.float32, device=device)
    return torch.stack(losses).sum(dtype=torch.float32)


def moved_state(state: ModelState | None, delta: int) -> ModelState | None:
    """``state`` with every position ``delta`` further (:meth:`~tvq_exp.attention.base.State.moved`)."""
    return state if state is None or delta == 0 else [s.moved(delta) for s in state]


def detach_state(state: ModelState | None) -> ModelState | None:
    """Detach every tensor of a carried state (gradients never cross segments)."""
    if state is None:
        return None
    return [s.map(Tensor.detach) for s in state]
