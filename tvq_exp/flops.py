"""FLOP formulas of the attention backends, the blocks and the whole decoder.

Convention: **matmuls only**, a ``(m, k) @ (k, n)`` product costs ``2·m·n·k``; element-wise work
(softmax, masks, feature maps, cumulative sums, scatter-adds) is not counted. The formulas count the
matmuls the implementations actually run (``torch.utils.flop_counter.FlopCounterMode`` is the
reference in the tests), so a causal dense product counts the full ``T×T`` square (unless its explicit
logits are chunked), chunked backends
count their padded tail and recomputation in a backward counts again: :func:`model_flops` is the
executed (hardware) FLOP count. ``backward=True`` adds the backward pass with every input and
parameter requiring a gradient (two matmuls per forward matmul, one where an operand is a buffer).

Attention shapes: ``seq_len`` ``T`` positions of ``batch`` sequences, ``heads`` query heads of
``d_k`` (keys) and ``d_v`` (values), ``kv_heads`` key/value heads; formulas are for a fresh
sequence (no carried state).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from torch import nn

from tvq_exp.attention import BACKENDS, AttentionBackend
from tvq_exp.attention.dense import query_chunks
from tvq_exp.blocks import GAUBlock, MHABlock
from tvq_exp.blocks.mha import glu_hidden

if TYPE_CHECKING:
    from tvq_exp.model import Decoder


def _mm(m: int, n: int, k: int) -> int:
    """FLOPs of one ``(m, k) @ (k, n)`` matmul."""
    return 2 * m * n * k


def _with_backward(flops: int, backward: bool) -> int:
    """``flops`` of matmuls whose two operands need gradients; the backward runs two more of each."""
    return flops * (3 if backward else 1)


def _padded(seq_len: int, chunk: int) -> int:
    """``seq_len`` rounded up to whole chunks."""
    return -(-seq_len // chunk) * chunk


def _xl_bias_flops(
    tokens: int, heads: int, d_k: int, window_len: int, backward: bool, causal: bool = True
) -> int:
    """Distance logits ``(q + v)·r_d`` for ``d = 0..M`` (encoder: ``-M..M``) of ``tokens`` queries (all
    sequences of the batch) plus the projection of the sinusoid table, done once per call."""
    d_sin = d_k + d_k % 2
    distances = window_len + 1 if causal else 2 * window_len + 1
    fwd = heads * _mm(tokens, distances, d_k) + _mm(distances, heads * d_k, d_sin)
    # backward: grad of the queries and of the projected table, and of the projection weight
    bwd = 2 * heads * _mm(tokens, distances, d_k) + _mm(distances, heads * d_k, d_sin)
    return fwd + (bwd if backward else 0)


def dense_flops(
    seq_len: int,
    d_k: int,
    d_v: int,
    heads: int = 1,
    batch: int = 1,
    backward: bool = False,
    causal: bool = True,
    window_bias: bool = False,
    window_len: int | None = None,
    talking_heads: bool = False,
    talking_heads_post: bool = False,
    score: str = "softmax",
    **_: Any,
) -> int:
    """Dense attention: ``q·kᵀ`` and ``p·v`` over the full ``T×T`` square (plus the XL bias, over the
    distances ``0..M``; encoder: ``-M..M``). With explicit logits beyond the chunking budget (see
    :func:`~tvq_exp.attention.dense.query_chunks`), each chunk of query rows over its visible keys
    only, and the forward once more in the backward (recomputation).

    ``heads·(2T²d_k + 2T²d_v)`` per sequence, whatever the score (softmax or ReLU²) and ``kv_heads``
    (keys and values are repeated to every query head). Talking heads mix the ``(H, T, T)`` logits
    (and, ``talking_heads_post``, the weights) with an ``(H, H)`` matrix: ``2H²T²`` each.
    """
    explicit = window_bias or score != "softmax" or talking_heads or talking_heads_post
    chunks = query_chunks(batch * heads, seq_len, seq_len, 0, causal) if explicit else [(0, seq_len, seq_len)]
    mixes = int(talking_heads) + int(talking_heads_post)
    scores = sum(
        heads * _mm(i1 - i0, end, d_k) + mixes * _mm(heads, (i1 - i0) * end, heads) for i0, i1, end in chunks
    )
    fwd = scores + sum(heads * _mm(i1 - i0, d_v, end) for i0, i1, end in chunks)
    # checkpointed chunks recompute their forward up to the weights (the product with the values, whose
    # output nothing saves, is not run again)
    recompute = len(chunks) > 1 and backward
    total = batch * (_with_backward(fwd, backward) + (scores if recompute else 0))
    if window_bias:
        window_len = int(window_len or 0)
        total += _xl_bias_flops(batch * seq_len, heads, d_k, window_len, backward, causal)
        if recompute:  # the distance logits again (the relative embeddings are an input of the chunks)
            distances = window_len + 1 if causal else 2 * window_len + 1
            total += heads * _mm(batch * seq_len, distances, d_k)
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
    grad_through_cache: bool = True,
    **_: Any,
) -> int:
    """Transformer-VQ: nearest-code search, then per query row one product with the ``W = 2L`` window
    keys plus ``S`` codes and one with the matching values (plus the XL bias). A fresh sequence of one
    block has a one-block window (``W = L``); the codes enter only when ``T > 2L`` (a block sees
    blocks two back).

    Query rows: ``T`` padded to whole blocks (a single block: its ``T`` rows only). The backward
    kernel recomputes the scores (and the distance logits) and takes gradients of everything but
    the codes: ``2·attend + H·2L·d_k`` per row (``+ H·(M + 1)·d_k`` with the bias) besides the
    forward, less the cache means' gradient ``H·S·d_v`` without ``grad_through_cache``.
    ``O(T·(2L + S)·(d_k + d_v))``: linear in ``T``.
    """
    kv_heads = heads if kv_heads is None else kv_heads
    window_len = block_len if window_len is None else window_len
    lone = seq_len <= block_len  # one block: its rows only, a one-block window
    rows = seq_len if lone else _padded(seq_len, block_len)
    window = block_len if lone else 2 * block_len
    cache = use_cache and seq_len > 2 * block_len  # some block sees blocks two back
    keys = window + (codebook_size if cache else 0)
    attend = heads * (_mm(rows, keys, d_k) + _mm(rows, d_v, keys))
    extra = heads * (  # backward beyond twice the forward: recomputed scores and distance logits
        _mm(rows, window, d_k) + (_mm(rows, window_len + 1, d_k) if window_bias else 0)
    )
    if cache and not grad_through_cache:
        extra -= heads * _mm(codebook_size, d_v, rows)
    total = batch * (
        kv_heads * _mm(seq_len, codebook_size, d_k)
        + _with_backward(attend, backward)
        + (extra if backward else 0)
    )
    if window_bias:
        total += _xl_bias_flops(batch * rows, heads, d_k, window_len, backward)
    return total


def _chunked_flops(padded: int, chunk: int, d_f: int, d_v: int, heads: int, kv_heads: int) -> int:
    """Forward of the chunk-wise mixed form shared by ``linear`` and ``flash_chunk``: per query head
    and chunk of ``C`` rows (of ``padded`` in all) the in-chunk scores ``(C, d_f)·(d_f, C)``, their
    product with the values ``(C, C)·(C, d_v)`` and the linear term ``(C, d_f)·(d_f, d_v)`` against
    the earlier chunks' ``Σ φ(k)vᵀ``; per key/value head and chunk that sum ``(d_f, C)·(C, d_v)``."""
    per_query_head = _mm(padded, chunk, d_f) + _mm(padded, d_v, chunk) + _mm(padded, d_v, d_f)
    return heads * per_query_head + kv_heads * _mm(d_f, d_v, padded)


def linear_flops(
    seq_len: int,
    d_k: int,
    d_v: int,
    heads: int = 1,
    batch: int = 1,
    backward: bool = False,
    kv_heads: int | None = None,
    causal: bool = True,
    feature_map: str = "elu1",
    chunk_size: int = 64,
    num_features: int | None = None,
    **_: Any,
) -> int:
    """Kernelised linear attention with features ``φ`` of size ``d_f`` (``d_k``; ``favor``: ``m``).

    Causal: chunks of ``C = min(chunk_size, T)`` (``T`` padded to whole chunks), see
    :func:`_chunked_flops`. Encoder: ``Σ φ(k)vᵀ`` once per key/value head (``2T·d_f·d_v``) and
    ``φ(q)·S`` per query head (``2T·d_f·d_v``). ``favor`` adds the random projection ``x·ωᵀ`` of
    queries and keys (``2T·d_k·m`` per head; ``ω`` is a buffer, so its backward is one matmul).
    """
    kv_heads = heads if kv_heads is None else kv_heads
    favor = feature_map == "favor"
    d_f = (num_features or d_k) if favor else d_k
    if causal:
        chunk = min(chunk_size, seq_len)
        attend = _chunked_flops(_padded(seq_len, chunk), chunk, d_f, d_v, heads, kv_heads)
    else:
        attend = (heads + kv_heads) * _mm(d_f, d_v, seq_len)
    total = _with_backward(batch * attend, backward)
    if favor:
        total += batch * (heads + kv_heads) * _mm(seq_len, d_f, d_k) * (2 if backward else 1)
    return total


def flash_chunk_flops(
    seq_len: int,
    d_k: int,
    d_v: int,
    heads: int = 1,
    batch: int = 1,
    backward: bool = False,
    kv_heads: int | None = None,
    causal: bool = True,
    group_size: int = 256,
    window_bias: bool = False,
    window_len: int | None = None,
    **_: Any,
) -> int:
    """FLASH mixed chunk attention: groups of ``G`` (``T`` padded to whole groups, even when shorter),
    see :func:`_chunked_flops` with ``d_f = d_k``, plus the XL bias inside the groups (window
    ``window_len``, default ``G``). The same count for both scores, both norms and the encoder."""
    kv_heads = heads if kv_heads is None else kv_heads
    padded = _padded(seq_len, group_size)
    total = _with_backward(batch * _chunked_flops(padded, group_size, d_k, d_v, heads, kv_heads), backward)
    if window_bias:
        window_len = group_size if window_len is None else window_len
        total += _xl_bias_flops(batch * padded, heads, d_k, window_len, backward, causal)
    return total


ATTENTION_FLOPS: dict[str, Callable[..., int]] = {
    "dense": dense_flops,
    "vq": vq_flops,
    "linear": linear_flops,
    "flash_chunk": flash_chunk_flops,
}
CAUSAL_ONLY = ("vq",)  # the encoder form (vq_bidirectional) has no formula


def attention_flops(name: str, seq_len: int, **options: Any) -> int | None:
    """FLOPs of backend ``name`` on ``batch`` sequences of ``seq_len``; ``None`` with no formula."""
    formula = ATTENTION_FLOPS.get(name)
    if formula is None or (name in CAUSAL_ONLY and not options.get("causal", True)):
        return None
    return formula(seq_len, **options)


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

    ``2T·d_model·(2H·d_k + 2d_v) + 2T·d_v·d_model`` per sequence with ``d_v = expansion·d_model``.
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
    return attn + _with_backward(batch * proj, backward)


def mha_block_flops(
    seq_len: int,
    d_model: int,
    attention: str,
    heads: int = 4,
    head_size: int | None = None,
    key_size: int | None = None,
    kv_heads: int | None = None,
    ff_mult: float = 4.0,
    batch: int = 1,
    backward: bool = False,
    **attention_options: Any,
) -> int | None:
    """One MHA block: ``W_q, W_kv, W_o``, its attention and the SwiGLU ``W_in, W_out`` (``None`` if unknown).

    Defaults as :class:`~tvq_exp.blocks.MHABlock` (``head_size = d_model / H``, ``key_size = head_size``,
    ``kv_heads = H``); with ``F`` the GLU width (:func:`~tvq_exp.blocks.mha.glu_hidden`), per sequence
    ``2T·d_model·(H·d_k + H_kv·(d_k + d_v) + H·d_v + 3F)`` besides the attention.
    """
    head_size = head_size or d_model // heads
    key_size = key_size or head_size
    kv_heads = kv_heads or heads
    attn = attention_flops(
        attention,
        seq_len,
        d_k=key_size,
        d_v=head_size,
        heads=heads,
        kv_heads=kv_heads,
        batch=batch,
        backward=backward,
        **attention_options,
    )
    if attn is None:
        return None
    hidden = glu_hidden(d_model, ff_mult)
    widths = heads * key_size + kv_heads * (key_size + head_size) + heads * head_size + 3 * hidden
    return attn + _with_backward(batch * _mm(seq_len, widths, d_model), backward)


# the backend attributes the formulas read (besides the shapes, which the blocks pass themselves)
_BACKEND_OPTIONS = (
    "causal",
    "codebook_size",
    "block_len",
    "use_cache",
    "feature_map",
    "chunk_size",
    "num_features",
    "group_size",
    "score",
)


def backend_options(attn: AttentionBackend) -> tuple[str, dict[str, Any]] | None:
    """The registered name of an attention module and the formula options read off it (``window_bias``,
    ``window_len``, ``codebook_size``, ``talking_heads``...); ``None`` for a backend not in
    :data:`~tvq_exp.attention.BACKENDS`."""
    name = next((key for key, cls in BACKENDS.items() if type(attn) is cls), None)
    if name is None:
        return None
    options = {key: getattr(attn, key) for key in _BACKEND_OPTIONS if hasattr(attn, key)}
    bias = getattr(attn, "bias", None)
    options["window_bias"] = bias is not None
    if bias is not None:
        options["window_len"] = bias.max_distance
    options["talking_heads"] = getattr(attn, "mix_pre", None) is not None
    options["talking_heads_post"] = getattr(attn, "mix_post", None) is not None
    return name, options


def block_flops(block: nn.Module, seq_len: int, batch: int = 1, backward: bool = False) -> int | None:
    """FLOPs of an instantiated :class:`~tvq_exp.blocks.GAUBlock` or :class:`~tvq_exp.blocks.MHABlock`
    on ``batch`` sequences of ``seq_len``; ``None`` for any other block or a backend with no formula."""
    spec = backend_options(block.attn) if isinstance(block, GAUBlock | MHABlock) else None
    if spec is None:
        return None
    name, options = spec
    if isinstance(block, GAUBlock):
        return gau_block_flops(
            seq_len, block.d_model, name, block.d_k, block.expansion, block.heads, batch, backward, **options
        )
    sizes = {"head_size": block.head_size, "key_size": block.key_size, "kv_heads": block.kv_heads}
    return mha_block_flops(
        seq_len,
        block.d_model,
        name,
        block.heads,
        ff_mult=block.ff_mult,
        batch=batch,
        backward=backward,
        **sizes,
        **options,
    )


def model_flops(model: Decoder, seq_len: int, batch: int = 1, backward: bool = False) -> int | None:
    """FLOPs of ``model`` (a :class:`~tvq_exp.model.Decoder`) on ``batch`` fresh sequences of ``seq_len``:
    every block plus the output head ``2T·d_model·V`` (embeddings are lookups: free). With
    ``backward`` a whole training step's matmuls (the optimiser runs none). ``None`` when a block
    has no formula."""
    total = _with_backward(batch * _mm(seq_len, model.vocab_size, model.d_model), backward)
    for block in model.blocks:
        flops = block_flops(block, seq_len, batch, backward)
        if flops is None:
            return None
        total += flops
    return total


__all__ = [
    "ATTENTION_FLOPS",
    "attention_flops",
    "backend_options",
    "block_flops",
    "dense_flops",
    "flash_chunk_flops",
    "gau_block_flops",
    "linear_flops",
    "mha_block_flops",
    "model_flops",
    "vq_flops",
]
