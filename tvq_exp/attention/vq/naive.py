"""Plain references of Transformer-VQ attention: the whole layer as one dense softmax over the quantised
keys, the fused window + cache step, and the compressive cache's running means. Written for clarity,
not speed; :mod:`tvq_exp.attention.vq` is tested against them.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tvq_exp.attention.base import repeat_kv
from tvq_exp.attention.dense.naive import window_bias_matrix
from tvq_exp.attention.vq.cache import block_stats
from tvq_exp.attention.vq.kernel import WindowInputs


def vq_attention(attn, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """:class:`~tvq_exp.attention.vq.VQAttention` (causal or encoder) as one dense softmax over the
    quantised keys: content query ``q + u``, XL bias at ``|i - j| <= M`` (causal: ``0 <= i - j``).
    Keys carry their straight-through gradient only where their block is within one block of the
    query's (the exact window), values only there unless ``grad_through_cache``; without
    ``grad_through_cache`` only the query's own block carries gradient. ``use_cache=False`` masks every key
    farther than ``M`` (causal: a sliding window over the distances ``0..M``; encoder: blocks beyond the
    neighbours). ``cache_key_grad``: the score of a query in block ``r`` with a key of code ``s`` beyond the
    window also carries the gradient of ``q·m_s``, ``m_s`` the mean of the keys of code ``s`` in blocks
    ``0..r-2`` (a zero in the forward). ``cache_code_grad``: those scores also carry the gradient of ``q·C_s`` to
    the code (a zero in the forward). ``cache_keys="mean"`` (with the cache): the score of such a key is ``q·m_s``,
    ``m_s`` the mean of the keys before quantisation of code ``s`` in blocks ``0..r-2``."""
    k_hat, codes, _ = attn.quantizer(k)
    heads = q.shape[1]
    raw = repeat_kv(attn.quantizer.search_keys(k), heads)
    k_hat, v = repeat_kv(k_hat, heads), repeat_kv(v, heads)
    codes = repeat_kv(codes[..., None], heads)[..., 0]
    t = q.shape[2]
    position = torch.arange(t, device=q.device)
    block = position // attn.block_len
    near = (block[:, None] - block[None, :]).abs() <= 1
    grad = near if attn.grad_through_cache or not attn.causal else block[:, None] == block[None, :]
    qc = q if attn.bias is None else attn.bias.content_query(q)
    logits = torch.where(grad, qc @ k_hat.transpose(-1, -2), qc @ k_hat.detach().transpose(-1, -2))
    far = block[:, None] - block[None, :] >= 2
    if getattr(attn, "cache_key_grad", False):
        scores = _mean_key_scores(qc.detach(), k_hat, codes, block, attn.codebook_size)
        logits = logits + (scores - scores.detach())
    if getattr(attn, "cache_code_grad", False):
        codebook = attn.quantizer.codebook.repeat_interleave(heads // attn.kv_heads, dim=0)  # (H, S, d)
        scores = qc.detach() @ _gather_codes(codebook, codes).transpose(-1, -2)
        logits = logits + (scores - scores.detach()) * far
    if getattr(attn, "cache_keys", "code") == "mean" and attn.use_cache:
        means = raw if attn.grad_through_cache else raw.detach()
        logits = torch.where(far, _mean_key_scores(qc, means, codes, block, attn.codebook_size), logits)
    if attn.bias is not None:
        logits = logits + window_bias_matrix(attn.bias, q, attn.causal)
    visible = torch.ones_like(near)
    if not attn.use_cache:
        visible = (position[:, None] - position[None, :] <= attn.window_len) if attn.causal else near
    if attn.causal:
        visible = visible & torch.ones_like(near).tril()
    a = torch.softmax(logits.masked_fill(~visible, float("-inf")), dim=-1)
    far_v = v if attn.grad_through_cache else v.detach()
    return (a * grad) @ v + (a * ~grad) @ far_v


def _mean_key_scores(qc: Tensor, keys: Tensor, codes: Tensor, block: Tensor, size: int) -> Tensor:
    """``(B, H, T, T)``: ``q_i·m`` with ``m`` the mean of the ``keys`` of code ``z_j`` in the blocks ``0..r_i-2``,
    where key ``j`` lies in them (zero elsewhere)."""
    far = (block[:, None] - block[None, :] >= 2).to(keys.dtype)  # (T query, T key)
    onehot = torch.nn.functional.one_hot(codes, size).to(keys.dtype)  # (B, H, T, S)
    counts = far @ onehot  # (B, H, T, S): keys of code s each query reads through the cache
    sums = torch.einsum("ij,bhjs,bhjd->bhisd", far, onehot, keys)
    means = sums / counts.clamp_min(1)[..., None]
    qm = torch.einsum("bhid,bhisd->bhis", qc, means)
    return qm.gather(-1, codes[..., None, :].expand(*qm.shape[:-1], codes.shape[-1])) * far


def _gather_codes(codebook: Tensor, codes: Tensor) -> Tensor:
    """``codebook (H, S, d)`` rows at ``codes (B, H, T)``: ``(B, H, T, d)``."""
    return torch.stack([codebook[h][codes[:, h]] for h in range(codebook.shape[0])], dim=1)


def window_cache_attention(inputs: WindowInputs) -> Tensor:
    """:func:`~tvq_exp.attention.vq.kernel.window_cache_attention` written plainly: full tensors, one softmax,
    autograd."""
    q, kb, vb, index, bias, cache, prev_masked = inputs
    n, items, rows, _ = q.shape
    L, blocks = kb.shape[2], kb.shape[1] - items + 1
    keys = torch.cat([kb[:, j : j + items] for j in range(blocks)], dim=2)
    vals = torch.cat([vb[:, j : j + items] for j in range(blocks)], dim=2)
    edge = q.new_tensor([0.0, float("-inf")]).expand(n, items, rows, 2)
    if bias is None:
        table = edge
    else:
        bias_q, rel = bias
        g = rel.shape[1]
        bq = bias_q.reshape(n, items, g, -1, bias_q.shape[-1])
        table = torch.cat([(bq @ rel[:, None].transpose(-1, -2)).reshape(n, items, rows, -1), edge], dim=-1)
    logits = table.gather(
        -1, index.table(q.device).repeat(rows // index.rows, 1).expand(n, items, rows, blocks * L)
    )
    if prev_masked:
        first = torch.zeros(items, 1, blocks * L, dtype=torch.bool, device=q.device)
        first[0, :, :L] = True
        logits = logits.masked_fill(first, float("-inf"))
    if cache is not None:
        codebook, log_n, mu = cache
        codes = codebook if codebook.dim() == 4 else codebook[:, None].expand(n, items, -1, -1)
        keys = torch.cat([keys, codes], dim=2)
        vals = torch.cat([vals, mu], dim=2)
        logits = torch.cat([logits, log_n[:, :, None, :].expand(n, items, rows, -1)], dim=-1)
    return torch.softmax(q @ keys.transpose(-1, -2) + logits, dim=-1) @ vals


def running_code_means(
    codes: Tensor, values: Tensor, valid: Tensor, n0: Tensor, mu0: Tensor
) -> tuple[Tensor, Tensor]:
    """:func:`running_code_means` as a plain Chan recurrence under autograd."""
    counts, means = block_stats(codes, values, valid, n0.shape[-1])
    n_run, mu_run = n0.to(counts.dtype), mu0.to(means.dtype)
    out_n, out_mu = [n_run], [mu_run]
    for count, mean in zip(counts.unbind(1), means.unbind(1), strict=True):
        n_run = n_run + count
        mu_run = mu_run + (count / n_run.clamp_min(1))[..., None] * (mean - mu_run)
        out_n.append(n_run)
        out_mu.append(mu_run)
    return torch.stack(out_n, 1), torch.stack(out_mu, 1)
