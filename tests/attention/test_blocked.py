"""The block layout VQ and OVQ share (``tvq_exp/attention/blocked.py``): where queries sit among the blocks, the
grouped-heads item layout of the kernels and its inverse, where the state is cut, and the window rules."""

from __future__ import annotations

import pytest
import torch

from tvq_exp.attention.blocked import BlockLayout, check_context, resolve_window, window_floats, window_start
from tvq_exp.options import OptionError


@pytest.mark.parametrize(
    ("start", "t", "expected"),
    [
        (
            5,
            2,
            BlockLayout(first=1, items=1, rows=2, offset=1, front=0, back=0),
        ),  # inside one block: row by row
        (0, 1, BlockLayout(0, 1, 1, 0, 0, 0)),  # the first token
        (6, 7, BlockLayout(1, 3, 4, 0, 2, 3)),  # positions 6..12: blocks 1..3, padded 2 before and 3 after
    ],
)
def test_layout_places_the_queries(start: int, t: int, expected: BlockLayout) -> None:
    layout = BlockLayout.of(start, t, 4)
    assert layout == expected and layout.last == expected.first + expected.items - 1
    rows = layout.positions(torch.device("cpu"))
    assert rows.tolist() == list(range(expected.offset, expected.offset + expected.rows))


@pytest.mark.parametrize(("start", "t"), [(6, 7), (5, 2), (0, 12)])
def test_grouped_items_hold_each_query_where_the_kernels_expect_it(start: int, t: int) -> None:
    """``(B, H, T, d)`` -> ``(B·H_kv, I, G·rows, d)``: query head ``h`` at position ``p`` sits in key head ``h // G``,
    item ``(start + p) // L - first``, row ``(h % G)·rows + (start + p) % L - offset``; the inverse gives it back."""
    b, h, hk, d, L = 2, 4, 2, 3, 4
    x = torch.randn(b, h, t, d)
    layout = BlockLayout.of(start, t, L)
    items = layout.to_grouped_items(x, hk)
    g = h // hk
    assert items.shape == (b * hk, layout.items, g * layout.rows, d)
    for head in range(h):
        for p in range(t):
            item = (start + p) // L - layout.first
            row = (head % g) * layout.rows + (start + p) % L - layout.offset
            assert torch.equal(items[1 * hk + head // g, item, row], x[1, head, p])
    assert torch.equal(layout.from_grouped_items(items, b, h), x)
    assert torch.equal(layout.from_items(layout.to_items(x)), x)
    # whole blocks are a view of the queries (no copy); else the padding rows are zeros
    whole = layout.front == layout.back == 0
    assert (layout.to_items(x).data_ptr() == x.data_ptr()) == whole
    padded = layout.to_items(x).flatten(2, 3)
    assert not padded[:, :, : layout.front].any() and not padded[:, :, padded.shape[2] - layout.back :].any()


def test_the_state_keeps_the_positions_since_the_previous_block() -> None:
    assert [window_start(t, 4) for t in (0, 3, 4, 7, 8, 13)] == [0, 0, 0, 0, 4, 8]
    assert window_floats(13, 4, 10) == (13 - 8) * 10 and window_floats(3, 4, 10) == 30


def test_window_and_context_rules() -> None:
    assert resolve_window(None, 8, object) == 8 and resolve_window(5, 8, object) == 5
    with pytest.raises(OptionError, match="window_len=9.*<= block_len=8"):
        resolve_window(9, 8, object)
    check_context(8, 8, object)
    with pytest.raises(OptionError, match="block_len=16.*context length 8"):
        check_context(16, 8, object)
