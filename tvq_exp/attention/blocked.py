"""The blocked layout Transformer-VQ and OVQ share.

Positions come in blocks of ``L``. A query in block ``r`` sees blocks ``r-1`` and ``r`` exactly (the window,
with the XL bias up to ``M = window_len <= L``) and a summary of blocks ``0..r-2`` (VQ's compressive cache, OVQ's
dictionary); the carried state keeps the positions since the start of the previous block. This module holds the
rules both follow: the window option and the context check, where the state is cut and its size,
:class:`BlockLayout`, where a call's queries sit among the blocks, and :class:`BlockedAttention`, the base class
with what the two backends share.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from tvq_exp.attention.base import AttentionBackend
from tvq_exp.measure.flops import xl_bias_flops
from tvq_exp.options import OptionError


def resolve_window(window_len: int | None, block_len: int, owner: type) -> int:
    """The bias window ``M``: ``block_len`` when None; :class:`OptionError` unless ``M <= L`` (the window spans
    one block back)."""
    window_len = block_len if window_len is None else window_len
    if window_len > block_len:
        raise OptionError("window_len", window_len, f"must be <= block_len={block_len}", owner)
    return window_len


def check_context(block_len: int, length: int, owner: type) -> None:
    """A block longer than the context (``length`` positions) never uses what lies beyond the window:
    :class:`OptionError` unless ``block_len <= length``."""
    if block_len > length:
        raise OptionError(
            "block_len", block_len, f"must be <= the context length {length} (data.seq_len; with TBPTT "
            "data.sequence_len): a longer block never uses the cache", owner,
        )  # fmt: skip


def window_start(t: int, block_len: int) -> int:
    """The first position the carried state keeps after ``t`` positions: the start of the previous block."""
    return max(0, (t // block_len - 1) * block_len)


def window_floats(t: int, block_len: int, per_position: int) -> int:
    """Elements of the carried window after ``t`` positions, ``per_position`` per kept position."""
    return (t - window_start(t, block_len)) * per_position


@dataclass(frozen=True)
class BlockLayout:
    """Where ``t`` queries starting at buffer position ``start`` sit in blocks of ``L``: blocks ``first ..
    first + items - 1`` (relative to the buffer, whose position 0 starts a block). One block (decoding, short
    continuations) is taken row by row (``rows = t``, the first at ``offset`` in its block); several are padded
    to whole blocks (``front`` rows before, ``back`` after; the padding rows are dropped again)."""

    first: int
    items: int
    rows: int
    offset: int
    front: int
    back: int

    @classmethod
    def of(cls, start: int, t: int, block_len: int) -> BlockLayout:
        first, last = start // block_len, (start + t - 1) // block_len
        items = last - first + 1
        if items == 1:
            return cls(first, 1, t, start - first * block_len, 0, 0)
        front = start - first * block_len
        return cls(first, items, block_len, 0, front, items * block_len - front - t)

    @property
    def last(self) -> int:
        """The block of the last query."""
        return self.first + self.items - 1

    def positions(self, device: torch.device) -> Tensor:
        """``(rows,)`` positions of the rows inside their block."""
        return torch.arange(self.rows, device=device) + self.offset

    def to_items(self, x: Tensor) -> Tensor:
        """``(B, H, T, d)`` -> ``(B, H, I, rows, d)``, padded to whole items (a view where they are whole already: a
        pad by nothing would copy)."""
        padded = F.pad(x, (0, 0, self.front, self.back)) if self.front or self.back else x
        return padded.unflatten(2, (self.items, self.rows))

    def from_items(self, x: Tensor) -> Tensor:
        """Inverse of :meth:`to_items`, padding dropped: ``(B, H, I, rows, d)`` -> ``(B, H, T, d)``."""
        return x.flatten(2, 3)[:, :, self.front : self.items * self.rows - self.back]

    def grouped_items(self, x: Tensor, kv_heads: int) -> Tensor:
        """``(B, H, T, d)`` -> ``(B, H_kv, I, G, rows, d)``: the ``G = H / H_kv`` query heads sharing a key head, per
        item (a view where the items are whole: the fused kernels' layout, read through its strides)."""
        h = x.shape[1]
        return self.to_items(x).unflatten(1, (kv_heads, h // kv_heads)).transpose(2, 3)

    def to_grouped_items(self, x: Tensor, kv_heads: int) -> Tensor:
        """``(B, H, T, d)`` -> ``(B·H_kv, I, G·rows, d)``: :meth:`grouped_items` with the heads stacked in each item's
        rows (the plain and flex kernels' layout; a copy where ``B`` and ``H_kv`` do not merge)."""
        return self.grouped_items(x, kv_heads).reshape(x.shape[0] * kv_heads, self.items, -1, x.shape[-1])

    def from_grouped_items(self, x: Tensor, batch: int, heads: int) -> Tensor:
        """Inverse of :meth:`to_grouped_items` (and of :meth:`grouped_items`): ``(B·H_kv, I, G·rows, d)`` (or ``(B,
        H_kv, I, G, rows, d)``) -> ``(B, H, T, d)``."""
        if x.dim() == 4:
            kv_heads = x.shape[0] // batch
            x = x.view(batch, kv_heads, self.items, heads // kv_heads, self.rows, -1)
        return self.from_items(x.transpose(2, 3).reshape(batch, heads, self.items, self.rows, -1))


class BlockedAttention(AttentionBackend):
    """Base of the blocked backends (Transformer-VQ, OVQ): ``block_len`` positions per block and the XL ``bias``
    (None without it) over ``window_len`` distances; the context rule and the bias's FLOPs they share."""

    supports_position_bias = True
    block_len: int
    window_len: int

    def check_context(self, length: int) -> None:
        """A block longer than the context never reaches past the window: ``block_len <= length``."""
        check_context(self.block_len, length, type(self))

    def bias_flops(self, rows: int, backward: bool) -> int:
        """FLOPs of the XL bias for ``rows`` query rows (over all sequences); 0 without the bias."""
        if self.bias is None:
            return 0
        d_sin = self.bias.proj.in_features
        return xl_bias_flops(rows, self.heads, self.d_k, self.window_len, backward, d_sin=d_sin)


__all__ = [
    "BlockLayout",
    "BlockedAttention",
    "check_context",
    "resolve_window",
    "window_floats",
    "window_start",
]
