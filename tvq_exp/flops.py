"""FLOP formulas of the attention backends and the GAU block.

Convention: **matmuls only**, a ``(m, k) @ (k, n)`` product costs ``2·m·n·k``; element-wise work
(softmax, masks, scatter-adds) is not counted. The formulas count the matmuls the implementations
actually run (``torch.utils.flop_counter.FlopCounterMode`` is the reference in the tests), so a
causal dense product counts the full ``T×T`` square and the VQ window counts both blocks.
``backward=True`` adds the backward pass with every input and parameter requiring a gradient.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _mm(m: int, n: int, k: int) -> int:
    """FLOPs of one ``(m, k) @ (k, n)`` matmul."""
    return 2 * m * n * k


def _xl_bias_flops(tokens: int, heads: int, d_k: int, window_len: int, backward: bool) -> int:
    """Distance logits ``(q + v)·r_d`` for ``d = 0..M`` of ``tokens`` queries (all sequences of the
    batch) plus the projection of the sinusoid table, done once per call."""
    d_sin = d_k + d_k % 2
    fwd = heads * _mm(tokens, window_len + 1, d_k) + _mm(window_len + 1, heads * d_k, d_sin)
    # backward: grad of the queries and of the projected table, and of the projection weight
    bwd = 2 * heads * _mm(tokens, window_len + 1, d_k) + _mm(window_len + 1, heads * d_k, d_sin)
    return fwd + (bwd if backward else 0)


def dense_flops(
    seq_len: int,
    d_k: int,
    d_v: int,
    heads: int = 1,
    batch: int = 1,
    backward: bool = False,
    window_bias: bool = False,
    window_len: int | None = None,
    **_: Any,
) -> int:
    """Dense attention: ``q·kᵀ`` and ``p·v`` over the full ``T×T`` square (plus the XL bias)."""
    fwd = heads * (_mm(seq_len, seq_len, d_k) + _mm(seq_len, d_v, seq_len))
    total = batch * fwd * (3 if backward else 1)  # backward: two matmuls per forward matmul
    if window_bias:
        total += _xl_bias_flops(batch * seq_len, heads, d_k, int(window_len or 0), backward)
    return total


def vq_flops(
    seq_len: int,
    d_k: int,
    d_v: int,
    heads: int = 1,
    batch: int = 1,
    backward: bool = False,
    kv_heads: int | None = None,
    codebook_size: int = 512,
    block_len: int = 512,
    window_bias: bool = True,
    window_len: int | None = None,
    use_cache: bool = True,
    **_: Any,
) -> int:
    """Transformer-VQ: nearest-code search, then per padded position one product with the
    ``2L`` window keys plus ``S`` codes and one with the matching values (plus the XL bias).

    ``O(T·(2L + S)·(d_k + d_v))``: linear in ``T``.
    """
    kv_heads = heads if kv_heads is None else kv_heads
    padded = -(-seq_len // block_len) * block_len
    keys = 2 * block_len + (codebook_size if use_cache else 0)
    attend = heads * (_mm(padded, keys, d_k) + _mm(padded, d_v, keys))
    total = batch * (kv_heads * _mm(seq_len, codebook_size, d_k) + attend * (3 if backward else 1))
    if window_bias:
        total += _xl_bias_flops(
            batch * padded, heads, d_k, block_len if window_len is None else window_len, backward
        )
    return total


ATTENTION_FLOPS: dict[str, Callable[..., int]] = {"dense": dense_flops, "vq": vq_flops}


def attention_flops(name: str, seq_len: int, **options: Any) -> int | None:
    """FLOPs of backend ``name`` on one sequence of ``seq_len``; ``None`` for a backend with no formula."""
    formula = ATTENTION_FLOPS.get(name)
    return None if formula is None else formula(seq_len, **options)


def gau_block_flops(
    seq_len: int,
    d_model: int,
    attention: str,
    d_k: int = 128,
    expansion: int = 2,
    heads: int = 1,
    batch: int = 1,
    backward: bool = False,
    **attention_options: Any,
) -> int | None:
    """One GAU block: projections ``W_qk, W_vg, W_o`` plus its attention (``None`` if unknown).

    ``attention_options`` are the backend's (``codebook_size``, ``block_len``, ``window_bias``...).
    """
    d_v = expansion * d_model
    attn = attention_flops(
        attention,
        seq_len,
        d_k=d_k,
        d_v=d_v // heads,
        heads=heads,
        batch=batch,
        backward=backward,
        **attention_options,
    )
    if attn is None:
        return None
    proj = (
        _mm(seq_len, 2 * heads * d_k, d_model) + _mm(seq_len, 2 * d_v, d_model) + _mm(seq_len, d_model, d_v)
    )
    return attn + batch * proj * (3 if backward else 1)


__all__ = ["ATTENTION_FLOPS", "attention_flops", "dense_flops", "gau_block_flops", "vq_flops"]
