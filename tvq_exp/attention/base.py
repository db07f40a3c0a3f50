"""The contract every attention backend follows.

A backend maps ``q, k: (B, H, T, d_k)`` and ``v: (B, H, T, d_v)`` to ``out: (B, H, T, d_v)``.
Keys and values may carry fewer heads than queries (``H_kv`` dividing ``H``: multi-query /
grouped attention) where the backend supports it. The backend applies **no** scaling to ``q·kᵀ``:
blocks scale ``q`` and ``k`` themselves.

``forward(q, k, v, state=None) -> (out, state, aux)``:
- ``state`` is ``None`` (a fresh sequence) or what the previous call returned (a :class:`State`: the position and
  the backend's own tensors, typed by its subclass); continuing with it equals running the concatenated sequence
  in one call (values; the carried state is detached).
- ``aux`` is a dict of tensors: losses under keys ending in ``_loss`` (added to the objective by
  the model) and detached metrics under other keys (logged).

What a backend can do is declared on its class (:class:`AttentionBackend`'s capabilities): the registry, config
validation, the benchmarks and the tests ask the class, never a backend's name.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Required, Self, TypedDict, TypeVar

import torch
from torch import Tensor, nn

from tvq_exp.nn.position import XLRelativeBias
from tvq_exp.options import OptionError, PositiveInt, checked

Aux = dict[str, Tensor]
# what a block passes to every backend's constructor (never config keys of the attention)
INJECTED_ARGUMENTS = frozenset({"d_k", "d_v", "heads", "kv_heads"})
TALKING_HEADS_ARGUMENTS = ("talking_heads", "talking_heads_post")
BackendT = TypeVar("BackendT", bound="AttentionBackend")


class Shape(TypedDict, total=False):
    """The options every backend takes and hands on to :class:`AttentionBackend`'s constructor (a subclass declares
    ``**shape: Unpack[Shape]`` after its own, keyword-only, options; config validation follows it there)."""

    d_k: Required[int]
    d_v: Required[int]
    heads: int
    causal: bool
    kv_heads: int | None


@dataclasses.dataclass(eq=False)
class State:
    """A recurrent state: ``position``, the positions seen so far; each backend's subclass adds its tensors (the
    encoder forms, which carry nothing, return this base). Equal states hold equal values (tensors compared
    exactly); :meth:`map` rebuilds one with every tensor transformed (detach, move)."""

    position: int

    def map(self, fn: Callable[[Tensor], Tensor]) -> Self:
        """A copy with ``fn`` applied to every tensor (nested states included)."""
        changes = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, Tensor):
                changes[field.name] = fn(value)
            elif isinstance(value, State):
                changes[field.name] = value.map(fn)
        return dataclasses.replace(self, **changes)

    def moved(self, delta: int) -> Self:
        """A copy at ``position + delta`` (nested states too), holding the same tensors: how the training step hands
        a compiled forward the state at its :meth:`AttentionBackend.equivalent_position` and takes it back."""
        changes: dict[str, Any] = {"position": self.position + delta}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, State):
                changes[field.name] = value.moved(delta)
        return dataclasses.replace(self, **changes)

    def tensors(self) -> list[Tensor]:
        """Every tensor the state holds (nested states included)."""
        found: list[Tensor] = []
        self.map(lambda t: found.append(t) or t)
        return found

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return all(_same(getattr(self, f.name), getattr(other, f.name)) for f in dataclasses.fields(self))

    __hash__ = None  # type: ignore[assignment]  (mutable, compared by value)

    def to_plain(self) -> dict[str, Any]:
        """The state as plain data: its class's name under ``"state"`` and its fields (tensors, numbers, nested
        states as plain data), what a checkpoint loaded ``weights_only`` holds; :meth:`from_plain` inverts it."""
        plain: dict[str, Any] = {"state": type(self).__name__}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            plain[field.name] = value.to_plain() if isinstance(value, State) else value
        return plain

    @staticmethod
    def from_plain(plain: Mapping[str, Any]) -> State:
        """The state :meth:`to_plain` wrote; its class must be a :class:`State` subclass (by name), so stored data
        never chooses what to build beyond that."""
        kinds = {kind.__name__: kind for kind in _state_classes(State)}
        name = plain.get("state")
        if name not in kinds:
            raise ValueError(f"unknown recurrent state {name!r}; known: {', '.join(sorted(kinds))}")
        fields = {
            key: State.from_plain(value) if isinstance(value, Mapping) and "state" in value else value
            for key, value in plain.items()
            if key != "state"
        }
        return kinds[name](**fields)


def _state_classes(kind: type[State]) -> list[type[State]]:
    return [kind, *(sub for child in kind.__subclasses__() for sub in _state_classes(child))]


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, Tensor) or isinstance(b, Tensor):
        return isinstance(a, Tensor) and isinstance(b, Tensor) and a.shape == b.shape and torch.equal(a, b)
    return a == b


class AttentionBackend(nn.Module, abc.ABC):
    """Base class: shape checks, the shared options (:class:`Shape`) and the capabilities a backend declares (class
    attributes, read by the registry, config validation, the benchmarks and the tests).

    Args:
        d_k, d_v: per-head key and value sizes.
        heads: query heads.
        causal: decoder (True) or encoder (False) attention; False only where ``supports_encoder``.
        kv_heads: key/value heads (divides ``heads``; 1 = multi-query; default ``heads``), where
            ``supports_kv_groups``.
    """

    supports_kv_groups: ClassVar[bool] = True  # keys/values may have fewer heads (``kv_heads``) than queries
    supports_position_bias: ClassVar[bool] = (
        False  # takes the XL relative bias a block builds (:meth:`use_position_bias`)
    )
    supports_talking_heads: ClassVar[bool] = (
        False  # mixes logits across heads (:data:`TALKING_HEADS_ARGUMENTS`)
    )
    supports_encoder: ClassVar[bool] = True  # ``causal=False`` is allowed
    has_codebook: ClassVar[bool] = False  # a learned codebook: options under ``codebook``, statistics to sync
    kernels: ClassVar[tuple[str, ...]] = (
        "plain",
    )  # the values of its ``kernel`` option (flex where it has one)

    @checked
    def __init__(
        self,
        d_k: PositiveInt,
        d_v: PositiveInt,
        heads: PositiveInt = 1,
        causal: bool = True,
        kv_heads: PositiveInt | None = None,
    ) -> None:
        super().__init__()
        kv_heads = heads if kv_heads is None else kv_heads
        if heads % kv_heads:
            raise OptionError("kv_heads", kv_heads, f"must divide heads={heads}", type(self))
        if kv_heads != heads and not self.supports_kv_groups:
            raise OptionError("kv_heads", kv_heads, "grouped key/value heads are not supported", type(self))
        if not causal and not self.supports_encoder:
            raise OptionError("causal", causal, "must be True: this backend has no encoder form", type(self))
        self.d_k, self.d_v, self.heads, self.kv_heads, self.causal = d_k, d_v, heads, kv_heads, causal
        self.bias: XLRelativeBias | None = None  # the XL relative bias, when a block hands one over
        self.window_len: int | None = (
            None  # the distances 0..window_len the bias covers (backends that take it)
        )

    def position_window(self) -> int:
        """The distances ``0..M`` an XL relative bias of this backend covers (its ``window_len``), for the block
        that builds the bias; :class:`~tvq_exp.options.OptionError` where the backend takes none."""
        if not self.supports_position_bias:
            raise OptionError(
                "position", "xl", f"the {type(self).__name__} backend has no relative position bias; use "
                "position=rope or position=none", type(self),
            )  # fmt: skip
        if self.window_len is None:
            raise OptionError("window_len", None, "the window bias needs a window length >= 1", type(self))
        return self.window_len

    def use_position_bias(self, bias: XLRelativeBias) -> Self:
        """Take the XL relative bias a block built for this backend (``heads``, ``d_k`` and
        :meth:`position_window` distances): it becomes ``self.bias``, its parameters this backend's."""
        expected = (self.heads, self.d_k, self.position_window())
        if (bias.heads, bias.d_k, bias.max_distance) != expected:
            raise ValueError(
                f"an XL bias of (heads, d_k, max_distance)={(bias.heads, bias.d_k, bias.max_distance)} does not "
                f"fit this backend's {expected}"
            )
        self.bias = bias
        return self

    def equivalent_position(self, t: int) -> int:
        """The least position whose carried state this backend treats as one at ``t`` in all but its position: the
        same shapes, branches and outputs, the next state's position moved by as much. A compiled step guards on
        the carried position (a Python int); a state moved to this position compiles once for every position that
        shares it (TBPTT's segments past the first). The default, ``t``, claims no equivalence."""
        return t

    def flops(self, seq_len: int, batch: int = 1, backward: bool = False) -> int | None:
        """Matmul FLOPs of one call on ``batch`` fresh sequences of ``seq_len`` positions (forward, or
        forward + backward), as :mod:`tvq_exp.measure.flops` counts them; ``None`` without a formula."""
        return None

    def check_context(self, length: int) -> None:
        """Raise :class:`~tvq_exp.options.OptionError` if this backend's options make no sense for sequences
        (contexts) of ``length`` positions; the default accepts any."""

    @abc.abstractmethod
    def state_floats(self, seq_len: int) -> int:
        """Size of the recurrent inference state per sequence after ``seq_len`` positions: the number of
        elements of the tensors ``forward`` returns in ``state`` (integer codes counted too)."""

    def check_inputs(self, q: Tensor, k: Tensor, v: Tensor) -> None:
        """Validate ``q, k, v`` shapes against the backend's configuration."""
        if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
            raise ValueError(
                f"q, k, v must be (B, H, T, d); got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
            )
        b, h, t, dk = q.shape
        if h != self.heads or dk != self.d_k:
            raise ValueError(f"q has shape {tuple(q.shape)}; expected (B, {self.heads}, T, {self.d_k})")
        if k.shape[0] != b or k.shape[2] != t or k.shape[3] != dk or v.shape[:3] != k.shape[:3]:
            raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} do not match q {tuple(q.shape)}")
        if v.shape[-1] != self.d_v:
            raise ValueError(f"v has d_v={v.shape[-1]}; expected {self.d_v}")
        if k.shape[1] != self.kv_heads:
            raise ValueError(f"k has {k.shape[1]} heads; expected kv_heads={self.kv_heads}")


def with_position_bias(
    attn: BackendT, sinusoid_dim: int | None = None, sinusoid_dropout: float = 0.0
) -> BackendT:
    """``attn`` with a new XL relative bias over its window (what a block with ``position=xl`` does): sinusoids
    ``sinusoid_dim`` wide (default ``d_k``; the blocks pass ``d_model``, as the official code) and their dropout,
    see :class:`~tvq_exp.nn.position.XLRelativeBias`."""
    window = attn.position_window()
    return attn.use_position_bias(
        XLRelativeBias(attn.heads, attn.d_k, window, sinusoid_dim, sinusoid_dropout)
    )


def repeat_kv(x: Tensor, heads: int) -> Tensor:
    """Expand grouped key/value heads ``(B, H_kv, T, d)`` to ``(B, heads, T, d)``."""
    if x.shape[1] == heads:
        return x
    return x.repeat_interleave(heads // x.shape[1], dim=1)


def causal_mask(t_q: int, t_k: int, offset: int, device: torch.device) -> Tensor:
    """Boolean ``(t_q, t_k)``: True where key ``j`` is visible to query ``i`` (``j <= i + offset``)."""
    i = torch.arange(t_q, device=device)[:, None] + offset
    j = torch.arange(t_k, device=device)[None, :]
    return j <= i


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp32 for half-precision inputs (autocast), else the input's own dtype (fp32 / fp64)."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def own_copy(x: Tensor) -> Tensor:
    """``x``, a cut of a larger tensor a carried state keeps, copied alone in standard strides (``contiguous()``
    returns the view itself where every dim before the cut has size 1, as with ``B = H_kv = 1``: it would hold the
    whole tensor until the next call, in strides that change with the call's length, on which a compiled block
    guards)."""
    return x.clone(memory_format=torch.contiguous_format)
