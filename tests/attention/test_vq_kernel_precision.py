"""The window + cache kernel on bf16 operands forms its logits and their gradient in fp32: against the same
kernel on the same (bf16-representable) values in fp32, the only differences are the bf16 roundings the
kernel is allowed (the weights before the values' product, the means, the output) and fp32 accumulation
order. Rounding the logits to bf16 before the softmax, or ``dO·V^T`` before ``dS``, exceeds the bounds."""

from __future__ import annotations

import pytest
import torch

from tests.attention.test_vq import grouped, kernel_inputs
from tvq_exp.attention.vq.kernel import ChunkParts, window_cache_attention
from tvq_exp.attention.vq.naive import window_cache_attention as window_cache_reference

U_BF16, U_FP32 = 2.0**-8, 2.0**-24  # unit roundoffs: 8 and 24 significant bits
LOW = (
    "q",
    "kb",
    "vb",
    "bias_q",
    "rel",
    "codebook",
    "mu",
)  # what the layer hands over in bf16 (mu: rounded here)


def bf16_inputs() -> tuple[dict, dict]:
    """The kernel's inputs with bias and cache, bf16 (``mu`` fp32, as the layer passes it) and the same values
    in fp32; ``q``, ``kb`` and ``bias_q`` scaled so that content and bias logits reach ~10, where bf16 keeps
    ~0.04 of them."""
    torch.manual_seed(0)
    base = {
        k: v.detach().float() if v.is_floating_point() else v for k, v in kernel_inputs(True, True).items()
    }
    base["q"], base["kb"], base["bias_q"] = base["q"] * 2, base["kb"] * 2, base["bias_q"] * 3
    low = {k: (v.bfloat16() if k in LOW else v) for k, v in base.items()}
    low["mu"] = low["mu"].float()  # bf16-representable, fp32 (the kernel rounds nothing more)
    same = {k: (v.float() if v.is_floating_point() else v) for k, v in low.items()}
    return low, same


def abs_logit_bound(same: dict) -> float:
    """The largest ``Σ|q_i·k_i|`` (plus ``Σ|bq_i·r_i|``) of any logit: fp32 accumulation in another order moves
    a logit by at most ``d·u`` of it."""
    q, kb, bq, rel = (same[k].abs() for k in ("q", "kb", "bias_q", "rel"))
    keys = torch.cat([kb.flatten(1, 2), same["codebook"].abs()], dim=1)  # (N, K, d_k)
    return float(
        (q.flatten(1, 2) @ keys.transpose(-1, -2)).max() + (bq.flatten(1, 2) @ rel.flatten(1, 2).mT).max()
    )


def test_bf16_logits_are_formed_in_fp32_before_the_softmax() -> None:
    low, same = bf16_inputs()
    out_low = window_cache_attention(grouped(low))
    out = window_cache_attention(grouped(same))
    assert out_low.dtype == torch.bfloat16 and out.dtype == torch.float32
    # the kernel rounds the weights p to bf16 (u·p each; the means are bf16 numbers): at most u·Σ p·|v|
    weighted_abs = window_cache_reference(grouped(same | {"vb": same["vb"].abs(), "mu": same["mu"].abs()}))
    dk, columns = same["q"].shape[-1], 2 * same["kb"].shape[2] + same["codebook"].shape[-2]
    # fp32 order: logits move by <= dk·u·A, the weights by <= 2 of that (relative); the products by columns·u
    fp32 = (2 * dk * U_FP32 * abs_logit_bound(same) + columns * U_FP32) * weighted_abs
    # and rounding the output to bf16: |fl(x) - y| <= u·|y| + (1 + u)·|x - y|
    bound = U_BF16 * out.abs() + (1 + U_BF16) * (U_BF16 * weighted_abs + fp32)
    excess = (out_low.float() - out).abs() / bound
    assert excess.max() <= 1, excess.max()
    assert excess.max() > 0.05  # the bound is not vacuous: the allowed roundings use a part of it


def test_bf16_logit_gradient_is_formed_in_fp32() -> None:
    """``dS = p·(dO·[V; μ]^T − Σ dO·O)`` on bf16 ``dO, V, μ, O`` equals its fp32 value on the same numbers within
    fp32 accumulation order; ``dO·V^T`` rounded to bf16 would be off by ``u_bf16`` of it."""
    low, same = bf16_inputs()
    same["mu"] = low["mu"] = low["mu"].bfloat16().float()  # the kernel's bf16 means, the same in both
    n, items, rows, dv = same["q"].shape[0], same["q"].shape[1], same["q"].shape[2], same["vb"].shape[-1]
    do = torch.randn(n, items, rows, dv).bfloat16()
    out = window_cache_attention(grouped(same)).bfloat16()

    def parts(x: dict) -> ChunkParts:
        inputs = grouped(x)
        q, kb, vb, index = inputs[:4]
        return ChunkParts(
            q, kb, vb, index.table(), *inputs.bias, *inputs.cache, inputs.prev_masked, index.keys()
        )

    p = parts(same).probabilities(0, items)  # the same weights in both
    ds_low = parts(low).logit_grad(p, do, out, 0, items)
    ds = parts(same).logit_grad(p, do.float(), out.float(), 0, items)
    assert ds_low.dtype == torch.float32
    # |dO|·[|V|; |μ|]^T and |dO|·|O|: each fp32 dot of dv terms is off by <= dv·u of its absolute sum; then
    # the difference and the product with p round once each (u·|dS| each); the bound itself in fp64
    vals = torch.cat([same["vb"][:, :-1], same["vb"][:, 1:]], dim=2)  # (N, I, 2L, dv)
    vals = torch.cat([vals, same["mu"]], dim=2).double().abs()
    abs_dp = do.double().abs() @ vals.transpose(-1, -2)
    abs_delta = (do.double().abs() * out.double().abs()).sum(-1, keepdim=True)
    bound = p.double() * dv * U_FP32 * (abs_dp + abs_delta) + 2 * U_FP32 * ds.double().abs()
    diff = (ds_low - ds).double().abs()
    assert (diff <= bound).all(), (diff / bound).nan_to_num().max()  # exact where p = 0


def test_bf16_values_keep_the_means_for_the_backward_in_bf16_and_their_gradient_in_fp32() -> None:
    """The layer hands the cache's means in fp32 and the products take them in the values' dtype: the backward keeps
    that bf16 copy (half the bytes; a paper GAU's means are ``S × d_v`` per item, 6 MB per 2048 tokens) and not the
    fp32 one. ``mu``'s gradient is still fp32, and the same as when the fp32 means were kept."""
    low, _ = bf16_inputs()
    low = {k: v.detach().requires_grad_(v.is_floating_point() and k != "log_n") for k, v in low.items()}
    kept: list[torch.Tensor] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t) or t, lambda t: t):
        out = window_cache_attention(grouped(low))
    means = [t for t in kept if t.shape == low["mu"].shape]
    assert [t.dtype for t in means] == [torch.bfloat16]
    assert torch.equal(means[0], low["mu"].bfloat16())
    do = torch.randn_like(out)
    (dmu,) = torch.autograd.grad(out, low["mu"], do)
    inputs = grouped({k: v.detach() for k, v in low.items()})
    parts = ChunkParts(
        *inputs[:3],
        inputs.index.table(),
        *inputs.bias,
        *inputs.cache,
        inputs.prev_masked,
        inputs.index.keys(),
    )
    p = parts.probabilities(0, low["q"].shape[1]).to(do.dtype)
    assert dmu.dtype == torch.float32
    assert torch.equal(dmu, (p[..., -low["mu"].shape[2] :].transpose(-1, -2) @ do).float())


@pytest.mark.parametrize("keys", [torch.float32, torch.bfloat16])
def test_on_cuda_queries_and_keys_of_two_dtypes_are_multiplied_widened(keys: torch.dtype) -> None:
    """On a GPU the products of bf16 operands run as one cuBLAS call writing fp32, which takes operands of one dtype:
    bf16 queries against fp32 keys (unit-norm keys are fp32 under CUDA's autocast) are widened, as on a CPU. Traced on
    fake CUDA tensors: the forward and every gradient of :class:`ChunkParts` take their shapes and dtypes."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(), torch.device("cuda"):
        inputs = {k: v.detach().to("cuda") for k, v in kernel_inputs(True, True).items()}
        low = {
            k: v.bfloat16() if k in ("q", "vb", "bias_q", "rel", "mu") else v.float()
            for k, v in inputs.items()
        }
        low["kb"], low["codebook"] = (
            low["kb"].to(keys),
            low["codebook"].to(keys),
        )  # the layer casts the codes to the keys
        grouped_inputs = grouped(low)
        out = window_cache_attention(grouped_inputs)
        assert (out.device.type, out.dtype) == ("cuda", torch.bfloat16)
        q, kb, vb, index = grouped_inputs[:4]
        parts = ChunkParts(q, kb, vb, index.table(), *grouped_inputs.bias, *grouped_inputs.cache,
                           grouped_inputs.prev_masked, index.keys())  # fmt: skip
        grads = parts.backward(torch.ones_like(out), out, chunk=2, want_mu=True)
    assert [g.dtype for g in grads[:3]] == [torch.bfloat16, keys, torch.bfloat16]


def test_the_bias_gradient_gathers_the_logit_gradient_in_the_products_dtype() -> None:
    """The XL bias's distance gradients are gathered from the window's logit gradient as its products take it (bf16
    under bf16 operands), not from its fp32 form: a gather commutes with the cast, so the numbers are the same, and
    compiled, the fp32 form need not be written for the gather alone. Seen under a dispatch mode: the backward's
    gather of ``(N, I, R, M + 1)`` distance gradients is bf16 (the other gathers are the recomputed logits')."""
    from tests.helpers.ops import OpLog

    low, _ = bf16_inputs()
    low = {k: v.detach().requires_grad_(v.is_floating_point() and k != "log_n") for k, v in low.items()}
    out = window_cache_attention(grouped(low))
    with OpLog() as log:
        (drel,) = torch.autograd.grad(out, low["rel"], torch.randn_like(out))
    n, items, rows = low["q"].shape[:3]
    distances = n * items * rows * low["rel"].shape[-2]  # one chunk: every item's rows, M + 1 distances each
    assert [op.dtype for op in log.named("aten.gather") if op.numel == distances] == [torch.bfloat16]
    assert drel.abs().sum() > 0
