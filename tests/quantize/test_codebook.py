"""The quantiser: nearest codes and straight-through, EMA closed form, accumulation, k-means init, options."""

from __future__ import annotations

import math
import re

import pytest
import torch

from tests.helpers.ops import OpLog
from tvq_exp.quantize import VectorQuantizer, kmeans, nearest_code


def keys(b: int = 4, h: int = 2, t: int = 32, d: int = 3) -> torch.Tensor:
    return torch.randn(b, h, t, d)


def test_quantiser_returns_nearest_codes_with_straight_through() -> None:
    vq = VectorQuantizer(2, 8, 3)
    k = keys().requires_grad_(True)
    k_hat, codes, _ = vq(k)
    d2 = ((k.detach()[..., None, :] - vq.codebook[None, :, None]) ** 2).sum(-1)  # (B,H,T,S)
    assert torch.equal(codes, d2.argmin(-1))
    assert torch.allclose(
        k_hat,
        torch.gather(vq.codebook, 1, codes.transpose(0, 1).reshape(2, -1, 1).expand(-1, -1, 3))
        .view(2, 4, 32, 3)
        .transpose(0, 1),
    )
    (g,) = torch.autograd.grad(k_hat.sum() * 3.0, k)
    assert torch.allclose(g, torch.full_like(g, 3.0))


@pytest.mark.parametrize("eps", [0.0, 1e-5])  # the official read-out (no smoothing), and Laplace smoothing
def test_ema_closed_form_after_k_steps(eps: float) -> None:
    decay = 0.9
    vq = VectorQuantizer(1, 4, 2, decay=decay, smoothing=eps)
    c0 = vq.codebook.clone()
    count, total = torch.ones(1, 4), c0.clone()
    for _ in range(5):
        k = torch.randn(2, 1, 16, 2)
        _, codes, _ = vq(k)
        onehot = torch.nn.functional.one_hot(codes.reshape(-1), 4).double()
        n = onehot.sum(0)
        s = onehot.T @ k.reshape(-1, 2).double()
        count = decay * count + (1 - decay) * n
        total = decay * total + (1 - decay) * s
        vq.update()
    assert torch.allclose(vq.ema_count.double(), count, atol=1e-6)
    smoothed = (count + eps) / (count.sum() + 4 * eps) * count.sum() if eps else count
    assert torch.allclose(vq.codebook.double(), total / smoothed.clamp_min(0.01)[..., None], atol=1e-5)


def test_official_initialisation_and_commitment_loss() -> None:
    """Codebook ``N(0, 1/(H·S))`` with counts one; the commitment loss sums the squared error over heads and
    key dimensions and averages over batch and positions (hand computation)."""
    torch.manual_seed(0)
    vq = VectorQuantizer(2, 512, 64)
    assert abs(float(vq.codebook.std()) - (2 * 512) ** -0.5) < 2e-3 and bool((vq.ema_count == 1).all())
    k = torch.randn(3, 2, 5, 64)
    k_hat, codes, aux = vq(k)
    expected = 1e-4 * ((k - k_hat.detach()) ** 2).sum(dim=(1, 3)).mean()
    assert torch.allclose(aux["commit_loss"], expected, rtol=1e-6)


def test_gradient_accumulation_matches_one_big_batch() -> None:
    torch.manual_seed(3)
    a, b = VectorQuantizer(2, 8, 3), VectorQuantizer(2, 8, 3)
    b.load_state_dict(a.state_dict())
    k = keys(b=6)
    for part in k.split(2):  # three micro-batches, one optimiser step
        a(part)
    a.update()
    b(k)
    b.update()
    assert torch.allclose(a.codebook, b.codebook, atol=1e-6) and torch.allclose(a.ema_count, b.ema_count)


def test_statistics_only_accumulate_in_training_with_grad() -> None:
    vq = VectorQuantizer(1, 4, 2)
    vq.eval()
    vq(keys(h=1, d=2))
    assert vq.pending_count.sum() == 0
    vq.train()
    with torch.no_grad():
        vq(keys(h=1, d=2))
    assert vq.pending_count.sum() == 0
    vq(keys(h=1, d=2))
    assert vq.pending_count.sum() == 4 * 32


def test_kmeans_init_lowers_quantisation_error() -> None:
    torch.manual_seed(0)
    centres = torch.randn(8, 4) * 5
    k = (centres[torch.randint(0, 8, (2048,))] + 0.05 * torch.randn(2048, 4)).view(4, 1, 512, 4)
    plain = VectorQuantizer(1, 8, 4)
    init = VectorQuantizer(1, 8, 4, init="kmeans", kmeans_iters=20)
    err_plain = float(plain(k)[2]["quant_error"])
    err_init = float(init(k)[2]["quant_error"])
    assert bool(init.initialized) and err_init < 0.05 * err_plain


def test_kmeans_recovers_separated_clusters() -> None:
    centres = torch.tensor([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]])
    x = (centres[torch.arange(300) % 3] + 0.1 * torch.randn(300, 2))[None]
    c = kmeans(x, 3, iters=15, generator=torch.Generator().manual_seed(1))
    assert torch.cdist(c[0], centres).min(0).values.max() < 0.2
    assert nearest_code(x, c).unique().numel() == 3


def test_gradient_strategy_trains_codebook_only_through_codebook_loss() -> None:
    vq = VectorQuantizer(1, 4, 2, update="gradient")
    k = torch.randn(2, 1, 8, 2, requires_grad=True)
    k_hat, _, aux = vq(k)
    (g_task,) = torch.autograd.grad(k_hat.sum(), vq.embed, allow_unused=True)
    assert g_task is None  # the task loss never reaches the codebook
    g_cb, g_k = torch.autograd.grad(aux["codebook_loss"] + aux["commit_loss"], (vq.embed, k))
    assert g_cb.abs().sum() > 0 and g_k.abs().sum() > 0
    assert isinstance(vq.embed, torch.nn.Parameter)


def test_ema_codebook_is_not_a_parameter_and_has_no_nan_with_empty_codes() -> None:
    vq = VectorQuantizer(1, 64, 2)
    assert not list(vq.parameters())
    for _ in range(300):  # almost every code empty for many steps
        vq(torch.zeros(1, 1, 4, 2))
        vq.update()
    assert torch.isfinite(vq.codebook).all() and torch.isfinite(vq.ema_count).all()


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"update": "adam"}, "update"),
        ({"codebook_size": 1}, "codebook_size"),
        ({"decay": 1.0}, "decay"),
        ({"reseed_fraction": 1.0}, "reseed_fraction"),
        ({"estimator": "gumbel"}, "estimator"),
        ({"init": "zeros"}, "init"),
    ],
)
def test_bad_codebook_options(kwargs: dict, match: str) -> None:
    opts = {"heads": 1, "codebook_size": 4, "dim": 2} | kwargs
    with pytest.raises(ValueError, match=match):
        VectorQuantizer(**opts)


@pytest.mark.parametrize(("smoothing", "expected"), [(0.0, [-1.0, 6.5 / 3.5]), (1.0, [-0.5, 6.5 / 3.0])])
def test_laplace_smoothing_moves_rarely_used_codes_by_hand(smoothing: float, expected: list[float]) -> None:
    """Codes ``-1, +1`` (counts 1), six keys at ``+2``, decay 0.5: counts ``[0.5, 3.5]`` (total 4), sums
    ``[-0.5, 6.5]``. Smoothed by 1: counts ``(n + 1) / (4 + 2) · 4 = [1, 3]``, so the codes move to ``-0.5`` and
    ``6.5/3`` where the plain read-out gives ``-1`` and ``6.5/3.5``: a difference of 0.5 and 0.31."""
    vq = VectorQuantizer(1, 2, 1, decay=0.5, smoothing=smoothing)
    with torch.no_grad():
        vq.embed.copy_(torch.tensor([[[-1.0], [1.0]]]))
        vq.ema_sum.copy_(vq.embed)
    _, codes, _ = vq(torch.full((1, 1, 6, 1), 2.0))
    assert codes.eq(1).all()
    vq.update()
    assert vq.ema_count.tolist() == [[0.5, 3.5]]
    assert vq.codebook.flatten().tolist() == pytest.approx(expected, abs=1e-6)


def test_a_long_unused_code_shrinks_to_its_sum_over_the_count_floor() -> None:
    """Code ``+1`` (count 1, sum 1) unused for 10 steps at decay 0.5: count and sum both fall to ``2^-10``, below
    the count floor 0.01, so the read-out is ``2^-10 / 0.01`` (the floor keeps an empty code finite)."""
    vq = VectorQuantizer(1, 2, 1, decay=0.5, count_floor=0.01)
    with torch.no_grad():
        vq.embed.copy_(torch.tensor([[[-1.0], [1.0]]]))
        vq.ema_sum.copy_(vq.embed)
    for _ in range(10):
        vq(torch.full((1, 1, 4, 1), -1.0))  # every key to code 0
        vq.update()
    assert vq.ema_count[0, 1].item() == pytest.approx(2.0**-10, rel=1e-6)
    assert vq.codebook[0, 1, 0].item() == pytest.approx(2.0**-10 / 0.01, rel=1e-5)


def test_the_nearest_code_is_searched_in_fp32_under_bf16_autocast() -> None:
    # keys between codes: a bf16 product rounds their distances to 8 bits and picks another code for some
    torch.manual_seed(0)
    x, codes = torch.randn(2, 4096, 64), torch.randn(2, 256, 64)
    want = nearest_code(x, codes)
    in_bf16 = ((codes * codes).sum(-1)[:, None] - 2 * (x.bfloat16() @ codes.bfloat16().mT).float()).argmin(-1)
    assert (in_bf16 != want).any()  # the case can tell the two apart
    quantizer = VectorQuantizer(2, 256, 64).eval()  # the layer's quantiser: keys (B, H, T, d)
    with torch.no_grad():
        _, plain, _ = quantizer(x[None])
        with torch.autocast("cpu", torch.bfloat16):
            assert torch.equal(nearest_code(x, codes), want)
            _, got, _ = quantizer(x[None])
    assert torch.equal(got, plain)


def test_bf16_keys_are_cast_once_and_read_their_codes_in_bf16() -> None:
    torch.manual_seed(0)
    vq = VectorQuantizer(2, 16, 8)
    leaf = torch.randn(2, 64, 2, 8, dtype=torch.bfloat16, requires_grad=True)
    k = leaf.transpose(1, 2)  # (B, H, T, d) in the layout a model's projections give
    with OpLog() as log:
        k_hat, codes, _ = vq(k)
    copies = [
        op.dtype for op in log.named("aten._to_copy", "aten.copy_", "aten.clone") if op.numel == k.numel()
    ]
    # the keys to fp32 once, for the search and the losses; the codes reach the keys' dtype as the codebook's rows,
    # cast before they are gathered (and straight-through's value is theirs: no sum, no copy)
    assert copies == [torch.float32]
    want = vq.codebook.detach().bfloat16()[torch.arange(2)[None, :, None], codes]
    assert k_hat.dtype == torch.bfloat16 and torch.equal(k_hat, want)


def test_keys_laid_out_by_head_are_copied_once_into_the_searchs_layout_then_cast_once() -> None:
    """Keys whose layout is ``(B, H, T, d)`` (not a view of ``(H, B·T, d)``): one copy in their own dtype into the
    layout of the search, the statistics and the losses, then one cast; not a cast, then a second fp32 copy."""
    torch.manual_seed(0)
    vq = VectorQuantizer(2, 16, 8)
    k = torch.randn(2, 2, 64, 8, dtype=torch.bfloat16, requires_grad=True)
    with OpLog() as log:
        vq(k)
    copies = [
        op.dtype for op in log.named("aten._to_copy", "aten.copy_", "aten.clone") if op.numel == k.numel()
    ]
    assert copies == [torch.bfloat16, torch.float32]


def test_compiled_the_quantiser_writes_one_fp32_copy_of_the_keys() -> None:
    """Compiled, the keys' fp32 copy is made once, in the layout its readers share (the losses, the metrics, the
    codebook's statistics): before, inductor wrote it in the keys' ``(B, H, T, d)`` and the statistics' ``(H, N, d)``
    copy again (512 MiB more of the GPU check's 32k forward)."""
    from torch._inductor.utils import run_and_get_code

    torch.manual_seed(0)
    vq = VectorQuantizer(2, 16, 8)
    leaf = torch.randn(2, 64, 2, 8, dtype=torch.bfloat16, requires_grad=True)

    def forward(x: torch.Tensor) -> torch.Tensor:
        k_hat, _, aux = vq(x.transpose(1, 2))
        return k_hat.float().sum() + aux["commit_loss"]

    torch._dynamo.reset()
    _, (code, *_) = run_and_get_code(torch.compile(forward, fullgraph=True, dynamic=False), leaf)
    keys = re.findall(r"empty_strided_cpu\(\((\d+), (\d+), (\d+)(?:, (\d+))?\), .*?, torch\.float32\)", code)
    sizes = [math.prod(int(n) for n in shape if n) for shape in keys]
    assert sizes.count(leaf.numel()) == 1, code


@pytest.mark.parametrize("fused_pass", [True, False])
def test_where_the_search_is_fused_bf16_keys_reach_it_uncast_as_a_view(
    fused_pass: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the fused pass after the search or torch's ops (which make the keys' fp32 copy: not the search's)."""
    import tvq_exp.quantize.codebook as codebook_module

    torch.manual_seed(0)
    vq = VectorQuantizer(2, 16, 8, fused_pass=fused_pass).eval()
    # (B, H, T, d) as the projections give it
    k = torch.randn(2, 64, 2, 8, dtype=torch.bfloat16).transpose(1, 2)
    searched = []

    def search(x: torch.Tensor, codebook: torch.Tensor) -> torch.Tensor:
        searched.append(x)
        return nearest_code(x, codebook)

    with torch.no_grad():
        _, want, _ = vq(k)  # on the CPU: the plain search of the fp32 copy
        monkeypatch.setattr(codebook_module, "fused_search", lambda x: True)  # as on CUDA with Triton
        monkeypatch.setattr(codebook_module, "nearest_code", search)
        _, got, _ = vq(k)
    (keys,) = searched
    assert keys.dtype == torch.bfloat16 and keys.data_ptr() == k.data_ptr()  # no copy
    assert torch.equal(keys, k.transpose(0, 1).reshape(2, 128, 8)) and torch.equal(got, want)


def test_the_code_search_takes_few_chunks_on_cuda_and_any_chunking_finds_the_same_codes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import importlib

    kmeans_module = importlib.import_module(
        "tvq_exp.quantize.kmeans"
    )  # the package exports the function kmeans

    assert kmeans_module.nearest_chunk_rows("cpu", 4, 512) == kmeans_module.NEAREST_ROWS
    # an H100's attention case: 128k keys per head, 4 heads of 512 codes: 8 chunks, not 64
    assert -(-131072 // kmeans_module.nearest_chunk_rows("cuda", 4, 512)) == 8
    assert kmeans_module.nearest_chunk_rows("cuda", 64, 65536) == kmeans_module.NEAREST_ROWS
    torch.manual_seed(1)
    x, codes = torch.randn(3, 1000, 16), torch.randn(3, 40, 16)
    want = nearest_code(x, codes)
    monkeypatch.setattr(kmeans_module, "NEAREST_ROWS", 7)
    assert torch.equal(nearest_code(x, codes), want)
