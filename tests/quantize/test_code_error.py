"""The quantiser's per-key kernels (``tvq_exp.quantize.code_error``), on CPU under Triton's interpreter and compiled on
CUDA where there is one: the squared errors, norms, code rows and the error's gradient against torch's ops, the
codes' sums against ``scatter_add_`` (and that deterministic algorithms take ``scatter_add_``), and the quantiser
that takes them where the search is fused equal to the quantiser that does not: codes, quantised keys, losses,
metrics, gradients and the EMA statistics."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import Tensor

import tvq_exp.quantize.code_error as code_error_module
from tvq_exp.quantize import VectorQuantizer
from tvq_exp.quantize.code_error import BM, add_code_sums, code_error

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA"))]


def _case(heads: int, rows: int, codes: int, dim: int, dtype: torch.dtype, device: str) -> tuple[Tensor, ...]:
    """Keys ``(H, N, d)`` strided as ``(B, T, H, d)`` keys are, a codebook and codes (each code used, some often)."""
    gen = torch.Generator().manual_seed(rows + dim)
    x = torch.randn(rows, heads, dim, generator=gen).to(dtype).transpose(0, 1)
    codebook = torch.randn(heads, codes, dim, generator=gen)
    index = torch.randint(0, codes, (heads, rows), generator=gen)
    return x.to(device), codebook.to(device), index.to(device)


def _rows(codebook: Tensor, index: Tensor) -> Tensor:
    return torch.gather(codebook, 1, index[..., None].expand(*index.shape, codebook.shape[-1]))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("rows", "dim"), [(2 * BM + 5, 12), (BM, 128), (3, 16)])  # ragged rows and dims
def test_the_errors_norms_rows_and_gradient_equal_torchs(rows: int, dim: int, dtype: torch.dtype, device: str) -> None:
    x, codebook, index = _case(3, rows, 37, dim, dtype, device)
    leaf = x.detach().requires_grad_(True)
    err, sq, value = code_error(leaf, codebook, index)
    want_rows = _rows(codebook, index)
    assert err.dtype == sq.dtype == torch.float32 and value.dtype == dtype and value.shape == x.shape
    torch.testing.assert_close(err, (x.float() - want_rows).pow(2).sum(-1), rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(sq, x.float().pow(2).sum(-1), rtol=1e-6, atol=1e-5)
    assert torch.equal(value, _rows(codebook.to(dtype), index))  # the codebook cast, then gathered
    weight = torch.randn(err.shape, generator=torch.Generator().manual_seed(3)).to(device)
    (grad,) = torch.autograd.grad((err * weight).sum(), leaf)
    plain = x.float().detach().requires_grad_(True)
    (want,) = torch.autograd.grad(((plain - want_rows).pow(2).sum(-1) * weight).sum(), plain)
    assert grad.dtype == dtype
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 1e-2, "atol": 1e-2}
    torch.testing.assert_close(grad.float(), want, **tol)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_codes_sums_equal_scatter_add(dtype: torch.dtype, device: str) -> None:
    x, codebook, index = _case(2, 3 * BM + 7, 5, 24, dtype, device)  # 5 codes: many keys add into each row
    start = torch.randn(codebook.shape, generator=torch.Generator().manual_seed(4)).to(device)
    sums = start.clone()
    add_code_sums(x, index, sums)
    want = start.clone().scatter_add_(1, index[..., None].expand(*index.shape, 24), x.float())
    torch.testing.assert_close(sums, want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="contiguous fp32"):
        add_code_sums(x, index, start.double())


def test_deterministic_algorithms_take_scatter_add(monkeypatch: pytest.MonkeyPatch) -> None:
    x, codebook, index = _case(2, 50, 5, 8, torch.float32, "cpu")
    sums = torch.zeros(codebook.shape)

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the atomic kernel ran under deterministic algorithms")

    monkeypatch.setattr(code_error_module, "_launch", refuse)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch, "are_deterministic_algorithms_enabled", lambda: True)
        add_code_sums(x, index, sums)
    torch.testing.assert_close(sums, torch.zeros_like(sums).scatter_add_(1, index[..., None].expand(2, 50, 8), x))


def _fused_everywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    """The quantiser as on CUDA with Triton: its per-key work and statistics fused (the search stays plain on CPU:
    the same codes)."""
    import tvq_exp.quantize.codebook as codebook_module
    import tvq_exp.quantize.ema as ema_module

    monkeypatch.setattr(codebook_module, "fused_search", lambda x: True)
    monkeypatch.setattr(ema_module, "fused_search", lambda x: True)


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float32, 1e-6), (torch.bfloat16, 1e-2)])
def test_the_quantiser_with_fused_per_key_work_equals_the_plain_one(
    monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype, tol: float
) -> None:
    torch.manual_seed(0)
    plain = VectorQuantizer(2, 16, 12, reseed_fraction=0.1, decay=0.5)
    fused = copy.deepcopy(plain)
    k = torch.randn(3, 20, 2, 12).to(dtype).transpose(1, 2)  # (B, H, T, d) as the projections give it
    weight = torch.randn(3, 2, 20, 12)

    def step(vq: VectorQuantizer) -> tuple[Tensor, ...]:
        torch.manual_seed(5)  # the re-seeding's draws
        leaf = k.detach().requires_grad_(True)
        k_hat, codes, aux = vq(leaf)
        loss = (k_hat.float() * weight).sum() + 1e3 * aux["commit_loss"]
        (grad,) = torch.autograd.grad(loss, leaf)
        return k_hat, codes, grad, *(aux[name] for name in ("commit_loss", "quant_error", "perplexity", "dead_codes"))

    want = step(plain)
    _fused_everywhere(monkeypatch)
    assert fused._fused_keys(k)
    got = step(fused)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])  # the codes' rows, the codes
    torch.testing.assert_close(got[2].float(), want[2].float(), rtol=tol, atol=tol)  # the keys' gradient
    for g, w in zip(got[3:], want[3:], strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=0)
    torch.testing.assert_close(fused.pending_sum, plain.pending_sum, rtol=1e-6, atol=1e-6)
    assert torch.equal(fused.pending_count, plain.pending_count)
    assert fused.recent_keys.dtype == torch.float32 and fused.recent_keys.shape == plain.recent_keys.shape
    for vq in (fused, plain):
        torch.manual_seed(6)
        vq.update()
    torch.testing.assert_close(fused.codebook, plain.codebook, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "option", [{"assignment": "sampled"}, {"hard_warmup": 3}, {"fit_weight": "fisher"}, {"update": "gradient"}]
)
def test_the_options_that_read_the_quantised_keys_keep_the_plain_path(
    monkeypatch: pytest.MonkeyPatch, option: dict[str, object]
) -> None:
    _fused_everywhere(monkeypatch)
    k = torch.randn(1, 2, 4, 8)
    assert VectorQuantizer(2, 4, 8)._fused_keys(k) and not VectorQuantizer(2, 4, 8, **option)._fused_keys(k)


def test_the_ops_compile_whole_with_their_gradient(monkeypatch: pytest.MonkeyPatch) -> None:
    """``torch.compile(fullgraph=True)`` of a training forward through the fused quantiser: no graph break (the
    ops' fake tensors and autograd formula), the same loss and gradient as eager."""
    _fused_everywhere(monkeypatch)
    torch.manual_seed(1)
    vq = VectorQuantizer(2, 8, 16)
    k = torch.randn(2, 2, 10, 16)

    def forward(leaf: Tensor) -> Tensor:
        k_hat, _, aux = vq(leaf)
        return k_hat.pow(2).sum() + 1e3 * aux["commit_loss"]

    torch._dynamo.reset()
    compiled = torch.compile(forward, backend="aot_eager", fullgraph=True, dynamic=False)
    results = []
    for fn in (forward, compiled):
        leaf = k.clone().requires_grad_(True)
        loss = fn(leaf)
        results.append((loss.detach(), torch.autograd.grad(loss, leaf)[0]))
        vq.discard_pending()
    torch.testing.assert_close(results[1][0], results[0][0], rtol=1e-6, atol=0)
    torch.testing.assert_close(results[1][1], results[0][1], rtol=1e-6, atol=1e-7)
