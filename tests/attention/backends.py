"""One row per attention backend: its small options for a block (group, chunk, bias window) of ``length``
positions and ``codes`` codes. The contract, block and FLOP tests are parametrised over this table (which
``test_contract.py::test_every_backend_has_a_row`` holds to ``BACKENDS``), so a new backend is covered by all
of them by adding its row here; what each test adds (the XL bias, RoPE, encoder form) it reads from the
backend's class capabilities.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tvq_exp.attention.base import AttentionBackend, with_position_bias
from tvq_exp.attention.registry import BACKENDS, build_attention

ROWS: dict[str, Callable[[int, int], dict[str, Any]]] = {
    "dense": lambda length, codes: {"window_len": length},
    "vq": lambda length, codes: {"codebook_size": codes, "block_len": length},
    "linear": lambda length, codes: {"chunk_size": length},
    "flash_chunk": lambda length, codes: {"group_size": length},
    "ovq": lambda length, codes: {"num_centroids": codes, "block_len": length},
}
NAMES = sorted(BACKENDS)


def small_options(name: str, length: int = 4, codes: int = 5, position_bias: bool = True) -> dict[str, Any]:
    """Options of backend ``name`` for :func:`build` (without ``d_k, d_v, heads``): its row, and the XL bias on where
    its class takes one and ``position_bias`` asks for it."""
    options = ROWS[name](length, codes)
    if position_bias and BACKENDS[name].supports_position_bias:
        options["window_bias"] = True
    return options


def backend_class(name: str) -> type[AttentionBackend]:
    """The class of backend ``name`` (its capabilities)."""
    return BACKENDS[name]


def build(name: str, window_bias: bool = False, **options: Any) -> AttentionBackend:
    """``build_attention(name, **options)``; with ``window_bias``, given the XL bias over its window that a block
    with ``position=xl`` builds (:func:`~tvq_exp.attention.base.with_position_bias`)."""
    attn = build_attention(name, **options)
    return with_position_bias(attn) if window_bias else attn
