"""bf16 precision of every attention kernel, measured against the same kernel in fp32 on the same inputs.

Each kernel runs twice on inputs already rounded to bf16: once in fp32, once in bf16 (bf16 tensors under
bf16 autocast). The contract (bf16 storage, fp32 accumulation) allows only the rounding of the tensors a kernel
stores in bf16, so the difference is bounded, element by element, by the sum of those roundings, each at most
the unit roundoff ``U = 2^-8`` of bf16 (8 significant bits) times the magnitude rounded, to first order:

- the output ``o_i``: ``U·|o_i|``;
- weights stored in bf16 before their product with the values ``v_j``: ``U·Σ_j |a_ij|·|v_j|``;
- logits ``s_ij`` stored in bf16 (a bf16 matmul's output): ``|δs_ij| <= U·|s_ij|``, which moves a softmax output
  by ``Σ_j p_ij·δs_ij·(v_j - o_i)``;
- VQ only: the cache means (fp32 running sums) stored in bf16 as values: ``U·|v|``.

Everything else (logit sums, log counts, the softmax, normalisers, running sums) stays fp32, so a kernel that
accumulates any of them in bf16 crosses the bound. The weights of dense, linear and FLASH attention are computed
here in fp64 from their formulas (and checked to give the kernel's fp32 output), so their bounds are tight:
correct kernels use about half of them. For VQ the bound uses norms (``|s_ij| <= |q_i|·K``, ``Σ p|v| <= max|v|``)
and inputs that make the cache's ``log n`` large (two clusters of 1000 keys) and the content logits small: a
bf16 logit sum errs by ``U·log n`` where the bound allows ``U·|q|·K``. The plain kernel uses 28% of its bound,
flex 19%; the plain kernel with its logits and softmax in bf16 (``acc = q.dtype``) 240% (measured when written).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import Tensor

from tests.attention.backends import build
from tvq_exp.attention.flex_runtime import FLEX_AVAILABLE

U = 2.0**-8  # unit roundoff of bf16: 8 significant bits, round to nearest
D = 16

# the VQ window + cache kernels; the Triton one runs on CPU under its interpreter (TRITON_INTERPRET=1), whose
# dots are fp32, so there it checks the kernel's own roundings (storage, the log-sum-exp, the cache's sums)
VQ_KERNELS = ["plain", "triton", *(["flex"] if FLEX_AVAILABLE else [])]

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


def _both(attn: torch.nn.Module, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """The kernel in fp32 and in bf16 (autocast) on the same bf16-rounded inputs: ``(fp32 out, bf16 out)``."""
    q, k, v = (x.bfloat16() for x in (q, k, v))
    with torch.no_grad():
        ref = attn(q.float(), k.float(), v.float())[0]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = attn(q, k, v)[0]
    assert low.dtype == torch.bfloat16 and ref.dtype == torch.float32
    return ref, low.float()


def _used(ref: Tensor, low: Tensor, bound: Tensor) -> float:
    """The largest share of its bound any output element uses."""
    return float(((low - ref).abs() / bound).max())


def _norms(x: Tensor) -> Tensor:
    return x.bfloat16().float().norm(dim=-1, keepdim=True)


def _vq_bound(ref: Tensor, q: Tensor, key_norm: Tensor, v_max: Tensor) -> Tensor:
    """``U·(|o| + 2V + 4·|q|·K·V)``: probabilities and cache means stored in bf16 (``Σ p|v| <= V`` each), logits
    stored in bf16 (``|δs| <= U·|q|·K``, moving the output by at most ``2·max|δs|·max|v - o| <= 4U·|q|·K·V``)."""
    return U * (ref.abs() + v_max * (2 + 4 * _norms(q) * key_norm))


def _two_clusters(t: int) -> tuple[Tensor, Tensor, Tensor]:
    """Keys in two tight clusters ``±c`` with values ``±w``, queries small: the cache holds two codes whose
    counts grow to ``t / 2`` (``log n`` up to 7), the content logits stay below 1."""
    c, w = torch.randn(D), 2 * torch.randn(D)
    sign = torch.randint(0, 2, (1, 2, t, 1)) * 2 - 1
    q = 0.02 * torch.randn(1, 2, t, D)
    k = sign * c + 0.1 * torch.randn(1, 2, t, D)
    v = sign * w + 0.1 * torch.randn(1, 2, t, D)
    return q, k, v


@pytest.mark.parametrize("kernel", VQ_KERNELS)
def test_vq_in_bf16_errs_only_by_bf16_storage(kernel: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if kernel == "triton" and not torch.cuda.is_available():
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    attn = build("vq", d_k=D, d_v=D, heads=2, codebook_size=4, block_len=16, kernel=kernel).eval()
    q, k, v = _two_clusters(2048)
    ref, low = _both(attn, q, k, v)
    key_norm = torch.maximum(_norms(k).max(), attn.codebook.float().norm(dim=-1).max())
    used = _used(ref, low, _vq_bound(ref, q, key_norm, v.bfloat16().float().abs().max()))
    assert used <= 1.0, f"the bf16 kernel errs by {used:.0%} of the bf16-storage bound"


def _random(t: int) -> tuple[Tensor, Tensor, Tensor]:
    return 0.3 * torch.randn(2, 2, t, D), 0.3 * torch.randn(2, 2, t, D), torch.randn(2, 2, t, D)


def _causal(t: int) -> Tensor:
    return torch.ones(t, t, dtype=torch.bool).tril()


def _dense_bound(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """Softmax ``p = softmax(q·kᵀ)`` (causal, fp64, from the formula): ``U·(|o| + Σ p|v| + Σ p·|s|·|v - o|)``
    (a logit error ``δ_j`` moves ``o`` by ``Σ_j p_j·δ_j·(v_j - o)``)."""
    s = (q @ k.transpose(-1, -2)).masked_fill(~_causal(q.shape[2]), float("-inf"))
    p = torch.softmax(s, dim=-1)
    o = p @ v
    spread = (v[:, :, None] - o[:, :, :, None]).abs()  # (B, H, i, j, d_v)
    logit = (p * s.nan_to_num(0.0, neginf=0.0).abs())[..., None]
    return o, U * (o.abs() + p @ v.abs() + (logit * spread).sum(3))


def _linear_bound(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """Normalised positive weights ``a_ij = φ(q_i)·φ(k_j) / Σ_j' φ(q_i)·φ(k_j')`` (``φ = elu + 1``, causal,
    fp64). Features and state are fp32, but autocast runs their products in bf16: the chunk's weights
    ``φ(q)·φ(k)`` and the numerator (``U·Σ a|v|`` each) and the normaliser (``U·|o|``), then the output:
    ``U·(2|o| + 2Σ a|v|)``."""
    fq, fk = torch.nn.functional.elu(q) + 1, torch.nn.functional.elu(k) + 1
    w = (fq @ fk.transpose(-1, -2)) * _causal(q.shape[2])
    a = w / w.sum(-1, keepdim=True)
    o = a @ v
    return o, 2 * U * (o.abs() + a @ v.abs())


def _flash_bound(q: Tensor, k: Tensor, v: Tensor, group: int = 32) -> tuple[Tensor, Tensor]:
    """FLASH ``relu2``, count norm (causal, fp64): query ``i`` weighs the keys of its group by
    ``relu(s_ij)²`` and the earlier groups' by ``s_ij``, over ``n_i = i + 1``. A bf16 logit errs the first by
    ``2U·s²``; the bf16 ``Σ k vᵀ`` of a group errs the second by ``U·(|q_i|·|k_j|)·|v_j|``:
    ``U·(|o| + Σ_group 2s²|v|/n + Σ_earlier (|q|·|k|)|v|/n)``."""
    t = q.shape[2]
    pos = torch.arange(t)
    same = (pos[:, None] // group == pos[None, :] // group) & _causal(t)
    earlier = pos[None, :] < (pos[:, None] // group) * group
    n = (pos + 1).to(q.dtype)[:, None]
    s = q @ k.transpose(-1, -2)
    o = ((torch.relu(s).square() * same + s * earlier) / n) @ v
    weights = (2 * s.square() * same + (q.abs() @ k.abs().transpose(-1, -2)) * earlier) / n
    return o, U * (o.abs() + weights @ v.abs())


CASES: dict[str, tuple[dict[str, object], Callable[..., tuple[Tensor, Tensor]]]] = {
    "dense": ({}, _dense_bound),
    "linear": ({"chunk_size": 32}, _linear_bound),
    "flash_chunk": ({"group_size": 32}, _flash_bound),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_kernel_in_bf16_errs_only_by_bf16_storage(name: str) -> None:
    options, bound_of = CASES[name]
    attn = build(name, d_k=D, d_v=D, heads=2, **options).eval()
    q, k, v = _random(256)
    ref, low = _both(attn, q, k, v)
    expected, bound = bound_of(*(x.bfloat16().double() for x in (q, k, v)))
    # the weights the bound is built from are the kernel's: their fp64 output is its fp32 output
    torch.testing.assert_close(ref, expected.float(), rtol=1e-4, atol=1e-5)
    used = _used(ref, low, bound.float())
    assert used <= 1.0, f"the bf16 kernel errs by {used:.0%} of the bf16-storage bound"
