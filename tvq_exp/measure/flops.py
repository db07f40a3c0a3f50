"""Counting matmul FLOPs: the helpers every ``flops()`` method uses (attention backends, blocks, decoder).

Convention: **matmuls only**, a ``(m, k) @ (k, n)`` product costs ``2·m·n·k``; element-wise work
(softmax, masks, feature maps, cumulative sums, scatter-adds) is not counted. Each ``flops()`` counts
the matmuls its implementation actually runs (``torch.utils.flop_counter.FlopCounterMode`` is the
reference in the tests): padded tails and recomputation in a backward count. ``backward=True`` adds
the backward pass with every input and parameter requiring a gradient (two matmuls per forward
matmul, one where an operand is a buffer). Formulas are for a fresh sequence (no carried state).
"""

from __future__ import annotations


def mm(m: int, n: int, k: int) -> int:
    """FLOPs of one ``(m, k) @ (k, n)`` matmul."""
    return 2 * m * n * k


def with_backward(flops: int, backward: bool) -> int:
    """``flops`` of matmuls whose two operands need gradients; the backward runs two more of each."""
    return flops * (3 if backward else 1)


def padded(seq_len: int, chunk: int) -> int:
    """``seq_len`` rounded up to whole chunks."""
    return -(-seq_len // chunk) * chunk


def xl_bias_flops(
    tokens: int,
    heads: int,
    d_k: int,
    window_len: int,
    backward: bool,
    causal: bool = True,
    d_sin: int | None = None,
) -> int:
    """Distance logits ``(q + v)·r_d`` for ``d = 0..M`` (encoder: ``-M..M``) of ``tokens`` queries (all
    sequences of the batch) plus the projection of the sinusoid table (``d_sin`` wide, default ``d_k``), done
    once per call."""
    d_sin = d_sin or d_k + d_k % 2
    distances = window_len + 1 if causal else 2 * window_len + 1
    fwd = heads * mm(tokens, distances, d_k) + mm(distances, heads * d_k, d_sin)
    # backward: grad of the queries and of the projected table, and of the projection weight
    bwd = 2 * heads * mm(tokens, distances, d_k) + mm(distances, heads * d_k, d_sin)
    return fwd + (bwd if backward else 0)


def chunked_flops(padded_len: int, chunk: int, d_f: int, d_v: int, heads: int, kv_heads: int) -> int:
    """Forward of the chunk-wise mixed form shared by ``linear`` and ``flash_chunk``: per query head
    and chunk of ``C`` rows (of ``padded_len`` in all) the in-chunk scores ``(C, d_f)·(d_f, C)``, their
    product with the values ``(C, C)·(C, d_v)`` and the linear term ``(C, d_f)·(d_f, d_v)`` against
    the earlier chunks' ``Σ φ(k)vᵀ``; per key/value head and chunk that sum ``(d_f, C)·(C, d_v)``."""
    per_query_head = mm(padded_len, chunk, d_f) + mm(padded_len, d_v, chunk) + mm(padded_len, d_v, d_f)
    return heads * per_query_head + kv_heads * mm(d_f, d_v, padded_len)


__all__ = ["chunked_flops", "mm", "padded", "with_backward", "xl_bias_flops"]
