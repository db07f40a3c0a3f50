"""The quantiser's fused pass over its keys (``tvq_exp.quantize.fused_statistics``), on CPU under Triton's interpreter
and on CUDA where there is one: the same code rows, squared error (and its gradient), squared norm, counts and per-code
key sums as the plain ops, for fp32 and bf16 keys in the layouts a model gives, ragged sizes; the quantiser's forward,
backward and update through it equal to its plain path; what it falls back from; its launches; its op's registration
and a compiled graph that keeps it."""

from __future__ import annotations

import importlib

import pytest
import torch

import tvq_exp.quantize.codebook as codebook_module
from tests.helpers.ops import OpLog
from tvq_exp.quantize.codebook import VectorQuantizer
from tvq_exp.quantize.fused_statistics import (
    METRICS_CODES,
    ROWS,
    CodeStatistics,
    code_statistics,
    fused_metrics,
    launch_error_grad,
    plain_metrics,
    plain_statistics,
)

kmeans_module = importlib.import_module(
    "tvq_exp.quantize.kmeans"
)  # (the package's name kmeans is the function)
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")


def keys(
    layout: str, b: int, h: int, t: int, d: int, dtype: torch.dtype, gen: torch.Generator
) -> torch.Tensor:
    """Keys ``(B, H, T, d)``: ``heads_inner`` a view of ``(B, T, H, d)`` (a model's projection), else contiguous."""
    if layout == "heads_inner":
        return torch.randn(b, t, h, d, generator=gen).to(dtype).transpose(1, 2)
    return torch.randn(b, h, t, d, generator=gen).to(dtype)


def bf16_ulps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``|a - b|`` in units of bf16's last place at ``b``."""
    ulp = torch.finfo(torch.bfloat16).eps * torch.exp2(
        torch.floor(torch.log2(b.float().abs().clamp_min(1e-30)))
    )
    return (a.float() - b.float()).abs() / ulp


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("layout", "b", "h", "t", "d", "s"),
    [
        ("heads_inner", 2, 3, 37, 20, 11),
        ("contiguous", 2, 3, ROWS[True] + 1, 16, 5),
        ("contiguous", 1, 1, 9, 7, 3),
    ],
)
def test_equals_the_plain_statistics(
    layout: str, b: int, h: int, t: int, d: int, s: int, dtype: torch.dtype
) -> None:
    gen = torch.Generator().manual_seed(b * 100 + t)
    k = keys(layout, b, h, t, d, dtype, gen).requires_grad_(True)
    codebook = torch.randn(h, s, d, generator=gen)
    codes = torch.randint(0, s, (h, b * t), generator=gen)
    got = code_statistics(k, codes, codebook, sums=True)
    want = plain_statistics(k, codes, codebook, sums=True)
    assert got.rows.dtype == dtype and got.rows.stride() == k.stride()  # the keys' layout
    assert torch.equal(got.rows, want.rows) and torch.equal(got.counts, want.counts)
    assert torch.allclose(got.sq_error, want.sq_error, rtol=1e-5) and not got.sq_norm.requires_grad
    assert torch.allclose(got.sq_norm, want.sq_norm, rtol=1e-5)
    assert torch.allclose(got.sums, want.sums, rtol=1e-6, atol=1e-6)
    (grad,) = torch.autograd.grad(got.sq_error * 0.37, k)
    (grad_want,) = torch.autograd.grad(want.sq_error * 0.37, k)
    assert grad.dtype == dtype and grad.stride() == k.stride()
    if dtype == torch.float32:
        assert torch.allclose(grad, grad_want, rtol=1e-6, atol=1e-7)
    else:  # the interpreter's bf16 stores truncate (a GPU's round to nearest)
        assert bf16_ulps(grad, grad_want).max() <= 1
    assert code_statistics(k, codes, codebook, sums=False).sums is None


def test_each_quantity_is_its_own_by_hand() -> None:
    """Two keys, one head, two codes, values small enough to add by hand."""
    k = torch.tensor([[[[1.0, 2.0], [3.0, -1.0], [0.0, 1.0]]]])  # (1, 1, 3, 2)
    codebook = torch.tensor([[[1.0, 1.0], [2.0, 0.0]]])
    codes = torch.tensor([[0, 1, 0]])
    got = code_statistics(k, codes, codebook, sums=True)
    assert torch.equal(got.rows, torch.tensor([[[[1.0, 1.0], [2.0, 0.0], [1.0, 1.0]]]]))
    assert got.sq_error.item() == 1.0 + 2.0 + 1.0 and got.sq_norm.item() == 5.0 + 10.0 + 1.0
    assert torch.equal(got.counts, torch.tensor([[2.0, 1.0]]))
    assert torch.equal(got.sums, torch.tensor([[[1.0, 3.0], [3.0, -1.0]]]))
    grad = launch_error_grad(k, codes, codebook, torch.tensor([0.5, 3.0]))  # its first element scales
    assert torch.equal(grad, k - got.rows)


def quantiser(**options: object) -> VectorQuantizer:
    torch.manual_seed(0)
    return VectorQuantizer(3, 16, 8, **options)


def test_the_metrics_of_one_launch_by_hand() -> None:
    """Two heads of four codes: counts 2, 2, 0, 0 (perplexity 2, two codes dead: under 1% of the fair share 1), and
    none at all (perplexity 1; no fair share, so none dead); a relative error of 3 / 12."""
    counts = torch.tensor([[2.0, 2.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    stats = CodeStatistics(torch.empty(0), torch.tensor(3.0), torch.tensor(12.0), counts, None)
    got = fused_metrics(stats, numel=10)
    assert torch.allclose(got.perplexity, torch.tensor(1.5), rtol=1e-6)
    assert got.quant_error.item() == 0.25 and got.dead_codes.item() == 1.0  # (2 + 0) / 2 heads


@pytest.mark.parametrize(("h", "s"), [(3, 11), (2, METRICS_CODES + 37), (1, 1)])
def test_the_metrics_of_one_launch_equal_torchs(h: int, s: int) -> None:
    """Random counts (a head without keys; codes at the dead threshold exactly, 1% of a fair share of 100), over
    several of the program's steps: perplexity to fp32's rounding, relative error and dead codes exactly."""
    gen = torch.Generator().manual_seed(s)
    counts = torch.randint(0, 300, (h, s), generator=gen).float()
    counts[0, : min(s, 7)] = 0.0
    if h > 1:
        counts[1] = 0.0
    if h > 2:  # a fair share of 100 a code: a count of 1 is at the threshold (alive), 0 under it
        counts[2] = 100.0
        counts[2, :2] = torch.tensor([1.0, 199.0])
        counts[2, 2:4] = torch.tensor([0.0, 100.0])
    stats = CodeStatistics(torch.empty(0), torch.tensor(7.25), torch.tensor(29.0), counts, None)
    got, want = fused_metrics(stats, numel=h * s), plain_metrics(stats, numel=h * s)
    assert torch.allclose(got.perplexity, want.perplexity, rtol=2e-6)
    assert torch.equal(got.quant_error, want.quant_error) and torch.equal(got.dead_codes, want.dead_codes)
    zero = CodeStatistics(torch.empty(0), torch.tensor(0.0), torch.tensor(0.0), counts, None)
    assert fused_metrics(zero, numel=5).quant_error.item() == 0.0  # all-zero keys: no division by zero


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("reseed", [0.0, 0.5])
def test_a_training_step_through_the_fused_pass_equals_the_plain_one(
    dtype: torch.dtype, reseed: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """k_hat, codes, every loss and metric, the keys' gradient (the attention's and the commitment loss's), and the
    codebook after the update, as on CUDA (the fused pass) and as elsewhere (torch's ops)."""
    gen = torch.Generator().manual_seed(1)
    leaf = torch.randn(2, 40, 3, 8, generator=gen).to(dtype)
    upstream = torch.randn(2, 3, 40, 8, generator=gen)
    results = []
    for fused in (False, True):
        monkeypatch.setattr(codebook_module, "fused_search", lambda x, on=fused: on)  # as on CUDA with Triton
        vq = quantiser(reseed_fraction=reseed)
        assert vq.fuses_statistics(leaf, training=True) is fused
        x = leaf.clone().requires_grad_(True)
        k_hat, codes, aux = vq(x.transpose(1, 2))
        loss = (k_hat.float() * upstream).sum() + aux["commit_loss"]
        loss.backward()
        pending = (vq.pending_count.clone(), vq.pending_sum.clone())
        torch.manual_seed(5)  # the re-seeding's draws
        vq.update()
        results.append((k_hat, codes, aux, x.grad, pending, vq.embed.clone(), vq.ema_count.clone()))
    (k_hat, codes, aux, grad, pending, embed, count), fused = results
    assert (
        torch.equal(fused[0], k_hat) and fused[0].stride() == k_hat.stride() and torch.equal(fused[1], codes)
    )
    assert aux.keys() == fused[2].keys()
    for name, value in aux.items():
        assert torch.allclose(fused[2][name], value, rtol=1e-5), name
    assert torch.allclose(
        fused[3].float(), grad.float(), rtol=1e-5, atol=1e-6 if dtype == torch.float32 else 1e-2
    )
    assert torch.equal(fused[4][0], pending[0]) and torch.allclose(
        fused[4][1], pending[1], rtol=1e-6, atol=1e-6
    )
    assert torch.allclose(fused[5], embed, rtol=1e-6, atol=1e-6) and torch.equal(fused[6], count)


@pytest.mark.parametrize(
    ("options", "in_evaluation"),
    [
        ({"update": "gradient"}, False),
        ({"update": "affine"}, False),
        ({"hard_warmup": 10}, True),
        ({"assignment": "sampled"}, True),
        ({"fit_weight": "fisher"}, False),
        ({"fused_pass": False}, False),  # asked for torch's ops
    ],
)
def test_what_needs_the_fp32_codes_or_keys_stays_on_the_plain_ops(
    options: dict, in_evaluation: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trainable rules' codebook loss (the gathered codes' gradient), the hard warm-up's blend and a drawn code
    in training, and the Fisher weights (the fp32 keys in a backward hook) are not in the fused pass; evaluation
    takes it where only training could not (the warm-up and the draw are training's)."""
    monkeypatch.setattr(codebook_module, "fused_search", lambda x: True)
    k = torch.randn(1, 3, 4, 8)
    vq = quantiser(**options)
    assert not vq.fuses_statistics(k, training=True)
    assert vq.fuses_statistics(k, training=False) is in_evaluation


def test_the_fused_pass_alone_reads_and_writes_key_sized_tensors(monkeypatch: pytest.MonkeyPatch) -> None:
    """In a training forward of bf16 keys laid out as a model's projection gives them, no ATen op but an allocation
    makes a key-sized tensor, and the quantiser's kernels are the search and the fused pass: the plain ops' fp32 copy of
    the keys, their fp32 gathered codes, the codes gathered in the keys' layout, the losses' and the statistics' passes
    are gone. The backward: one kernel for the commitment loss's gradient."""
    import triton.runtime.interpreter as interpreter

    monkeypatch.setattr(codebook_module, "fused_search", lambda x: True)
    monkeypatch.setattr(
        kmeans_module, "fused_search", lambda x: True
    )  # the fused search (its output is (H, N))
    launched: list[str] = []  # the launches recorded, not run: the interpreter's own copies not counted
    monkeypatch.setattr(
        interpreter.InterpretedFunction, "run", lambda self, *a, **k: launched.append(self.__name__)
    )
    vq = quantiser()
    k = torch.randn(2, 64, 3, 8).bfloat16().transpose(1, 2).requires_grad_(True)
    with OpLog() as log:
        k_hat, _, aux = vq(k)
    big = [op.name for op in log.launches() if op.numel >= k.numel()]
    kernels = ["pieces_kernel", "nearest_kernel", "statistics_kernel", "metrics_kernel"]
    assert big == ["aten.empty_like"] and launched == kernels, (big, launched)
    launched.clear()
    (k_hat.float().sum() + aux["commit_loss"]).backward()
    assert launched == ["error_grad_kernel"]


def test_compiled_the_quantiser_takes_the_plain_ops_in_one_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the pass is fused eagerly, a compiled quantiser traces the plain ops (inductor fuses them; a kernel
    launched inside the graph would break it), and equals the eager fused step: values, gradient, key sums."""
    monkeypatch.setattr(codebook_module, "fused_search", lambda x: True)
    leaf = torch.randn(2, 24, 3, 8)
    results = []
    for compiled in (False, True):
        vq = quantiser()
        x = leaf.clone().requires_grad_(True)

        def step(x: torch.Tensor, vq: VectorQuantizer = vq) -> torch.Tensor:
            k_hat, _, aux = vq(x.transpose(1, 2))
            return k_hat.square().sum() + aux["commit_loss"] + aux["quant_error"]

        torch._dynamo.reset()
        run = torch.compile(step, fullgraph=True, backend="aot_eager") if compiled else step
        loss = run(x)
        loss.backward()
        results.append((loss.detach(), x.grad, vq.pending_sum.clone()))
    (loss, grad, sums), (loss_c, grad_c, sums_c) = results
    assert torch.allclose(loss_c, loss, rtol=1e-6) and torch.allclose(grad_c, grad, rtol=1e-6, atol=1e-7)
    assert torch.allclose(sums_c, sums, rtol=1e-6, atol=1e-6)


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_on_cuda_the_fused_pass_equals_the_plain_one(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(4)
    k = keys("heads_inner", 4, 4, 4096 + 3, 128, dtype, gen).cuda().requires_grad_(True)
    codebook = torch.randn(4, 512, 128, generator=gen).cuda()
    codes = torch.randint(0, 512, (4, 4 * 4099), generator=gen).cuda()
    got = code_statistics(k, codes, codebook, sums=True)
    want = plain_statistics(k, codes, codebook, sums=True)
    assert torch.equal(got.rows, want.rows) and torch.equal(got.counts, want.counts)
    for name in ("sq_error", "sq_norm", "sums"):
        assert torch.allclose(getattr(got, name), getattr(want, name), rtol=1e-5, atol=1e-4), name
    (grad,) = torch.autograd.grad(got.sq_error * 0.37, k)
    (grad_want,) = torch.autograd.grad(want.sq_error * 0.37, k)
    if dtype == torch.float32:
        assert torch.allclose(grad, grad_want, rtol=1e-6, atol=1e-7)
    else:  # both round to nearest: at most the products' one ulp apart
        assert bf16_ulps(grad, grad_want).max() <= 1


@needs_cuda
def test_on_cuda_the_metrics_of_one_launch_equal_torchs() -> None:
    gen = torch.Generator().manual_seed(6)
    counts = torch.randint(0, 50, (4, 512), generator=gen).float()
    counts[1, :100] = 0.0
    stats = CodeStatistics(torch.empty(0), torch.tensor(12.5), torch.tensor(99.0), counts, None)
    cuda = CodeStatistics(*(None if x is None else x.cuda() for x in stats))
    got, want = fused_metrics(cuda, numel=4096), plain_metrics(stats, numel=4096)
    for name, value in want._asdict().items():  # a GPU's fp32 division may be a rounding off IEEE's
        assert torch.allclose(getattr(got, name).cpu(), value, rtol=2e-6), name
