"""What every block shares: its residual branch's dropout and LayerDrop, positions, the attention (with the XL bias
when ``position='xl'``) and the carried state layout."""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Required, TypedDict

import torch
from torch import Tensor, nn

from tvq_exp.attention.base import AttentionBackend, Aux, State, with_position_bias
from tvq_exp.measure.flops import with_backward
from tvq_exp.nn.dropout import StochasticDepth
from tvq_exp.nn.position import apply_rope
from tvq_exp.options import AtLeast, Between, OneOf, PositiveInt, checked

AttentionFactory = Callable[..., AttentionBackend]
POSITIONS = ("xl", "rope", "none")


@dataclass(eq=False)
class BlockState(State):
    """A block's carried state: its ``position``, its attention's state ``attn``, the LayerDrop mask ``keep``
    (``(B,)`` or None), which holds for the whole sequence, and, with ``key_smear``, the last position's key
    before smearing, ``last_key (B, H_kv, 1, d_k)`` (else None)."""

    attn: State
    keep: Tensor | None = None
    last_key: Tensor | None = None


class BlockOptions(TypedDict, total=False):
    """The options every block takes and hands on to :class:`ResidualBlock`'s constructor (a block declares
    ``**options: Unpack[BlockOptions]`` after its own, keyword-only, options; config validation follows it
    there)."""

    d_model: Required[int]
    attention: Required[AttentionFactory]
    position: str
    dropout: float
    layerdrop: float
    sinusoid_dropout: float
    sinusoid_dim: int | None
    key_smear: bool


class ResidualBlock(nn.Module, abc.ABC):
    """Base of the blocks: a pre-norm residual branch around an attention backend.

    Args:
        d_model: the model width.
        attention: the factory of the attention backend (``build_attention`` with its options).
        position: ``xl`` (the Transformer-XL relative bias, built here and handed to the backend), ``rope``
            (rotary embeddings of ``q, k``) or ``none``.
        dropout: residual dropout of the branch's output.
        layerdrop: the probability of dropping the branch per example for the whole sequence (its mask is
            carried in the state).
        sinusoid_dropout, sinusoid_dim: the XL bias's sinusoids: their dropout and width (default ``d_model``, as
            the official code).
        key_smear: smeared keys (Olsson et al. 2022, "In-context learning and induction heads"): the attention
            sees ``k'_t = σ(a)·k_t + (1 - σ(a))·k_{t-1}`` (``k_{-1} = 0`` at the start of a stream; one learnt
            logit ``a`` per key head, initialised at 0), so a key carries the previous position's content
            without a previous-token head having to be learnt first. Off in the official model.

    A subclass registers its projections, then its attention (:meth:`build_attention`), and computes the branch
    with :meth:`attend` and :meth:`residual`. Shapes: ``x (B, T, d_model)`` -> ``(B, T, d_model)``; state: a
    :class:`BlockState`.
    """

    attn: AttentionBackend

    @checked
    def __init__(
        self,
        d_model: PositiveInt,
        attention: AttentionFactory,
        position: Annotated[str, OneOf(*POSITIONS)] = "xl",
        dropout: Annotated[float, Between(0, 1, "[)")] = 0.0,
        layerdrop: Annotated[float, Between(0, 1, "[)")] = 0.0,
        sinusoid_dropout: Annotated[float, Between(0, 1, "[)")] = 0.0,
        sinusoid_dim: Annotated[int, AtLeast(2)] | None = None,
        key_smear: bool = False,
    ) -> None:
        super().__init__()
        self.d_model, self.position, self.key_smear = d_model, position, key_smear
        self.attention_factory = attention
        self.sinusoids = (sinusoid_dim or d_model, sinusoid_dropout)
        self.dropout = nn.Dropout(dropout)
        self.layerdrop = StochasticDepth(layerdrop)

    def build_attention(self, d_k: int, d_v: int, heads: int, **extra: Any) -> AttentionBackend:
        """The block's attention (``d_k, d_v`` per head): the factory's backend, given the XL bias over its window
        when ``position == 'xl'`` (a backend without one refuses it with the reason)."""
        attn = self.attention_factory(d_k=d_k, d_v=d_v, heads=heads, **extra)
        self.smear_logit = nn.Parameter(torch.zeros(extra.get("kv_heads", heads))) if self.key_smear else None
        return with_position_bias(attn, *self.sinusoids) if self.position == "xl" else attn

    def equivalent_position(self, t: int) -> int:
        """The attention's :meth:`~tvq_exp.attention.base.AttentionBackend.equivalent_position`; ``t`` with RoPE
        (rotations at absolute positions)."""
        return t if self.position == "rope" else self.attn.equivalent_position(t)

    @abc.abstractmethod
    def projection_flops(self, seq_len: int) -> int:
        """Matmul FLOPs of the block's projections per sequence of ``seq_len`` positions (forward)."""

    def flops(self, seq_len: int, batch: int = 1, backward: bool = False) -> int | None:
        """The attention's FLOPs (``None`` when it has no formula) plus :meth:`projection_flops`."""
        attn = self.attn.flops(seq_len, batch, backward)
        if attn is None:
            return None
        return attn + with_backward(batch * self.projection_flops(seq_len), backward)

    def attend(
        self, q: Tensor, k: Tensor, v: Tensor, state: BlockState | None
    ) -> tuple[Tensor, State, Tensor | None, Aux]:
        """The attention of ``q, k, v (B, H, T, d)`` continuing ``state`` (keys smeared with ``key_smear``, then
        RoPE at absolute positions with ``position == 'rope'``): ``(out (B, H, T, d_v), its state, the last
        key before smearing or None, aux)``."""
        k, last_key = self.smear(k, state)
        q, k = rotate(q, k, 0 if state is None else state.position, self.position)
        out, attn_state, aux = self.attn(q, k, v, None if state is None else state.attn)
        return out, attn_state, last_key, aux

    def smear(self, k: Tensor, state: BlockState | None) -> tuple[Tensor, Tensor | None]:
        """``k (B, H_kv, T, d)`` smeared with the previous position's key (that of ``state`` before the first),
        and the last key before smearing, when ``key_smear``; else ``(k, None)``."""
        if self.smear_logit is None:
            return k, None
        before = None if state is None else state.last_key
        first = torch.zeros_like(k[:, :, :1]) if before is None else before
        previous = torch.cat([first, k[:, :, :-1]], dim=2)
        mix = torch.sigmoid(self.smear_logit).to(k.dtype).view(1, -1, 1, 1)
        return mix * k + (1 - mix) * previous, k[:, :, -1:]

    def residual(self, branch: Tensor, state: BlockState | None) -> tuple[Tensor, Tensor | None]:
        """The branch's output after dropout and LayerDrop (its mask from ``state``, else drawn): ``(out, keep)``."""
        return self.layerdrop(self.dropout(branch), None if state is None else state.keep)

    @staticmethod
    def next_state(
        state: BlockState | None, t: int, attn: State, keep: Tensor | None, last_key: Tensor | None
    ) -> BlockState:
        """The carried state after ``t`` more positions."""
        return BlockState((0 if state is None else state.position) + t, attn, keep, last_key)


def rotate(q: Tensor, k: Tensor, t0: int, position: str) -> tuple[Tensor, Tensor]:
    """Apply RoPE at absolute positions ``t0..t0+T-1`` when ``position == 'rope'``."""
    if position != "rope":
        return q, k
    pos = t0 + torch.arange(q.shape[2], device=q.device)
    return apply_rope(q, pos), apply_rope(k, pos)
