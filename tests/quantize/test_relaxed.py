"""The ``relaxed`` estimator of the sampled assignment against hand computations: the value is the drawn code
(the straight-through quantiser's draw), the key gradient is straight-through's plus the Gumbel-softmax
relaxation's of the same draw, the codes of a trainable rule get the relaxation's gradient too, nothing of it
is left at temperature 0, and VQ attention stays dense softmax over the quantised keys and causal."""

from __future__ import annotations

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from tests.attention.backends import build
from tests.helpers.paths import CONF
from tests.helpers.vq_reference import assert_equals_reference
from tvq_exp.quantize import VectorQuantizer
from tvq_exp.quantize.sampling import relaxed_code, sampled_code, sampled_code_and_noise
from tvq_exp.run.validation import validate

# dyadic keys and codes: every distance, and the batch's mean nearest distance m, is exact in fp32 and fp64
KEYS = torch.tensor([[0.5, 0.25], [-0.75, 0.5], [0.25, -1.0], [1.0, 1.0]], dtype=torch.float64)
CODES = torch.tensor([[0.5, 0.0], [-0.5, 0.5], [0.0, -0.75]], dtype=torch.float64)
SEED = 3


def quantiser(estimator: str = "relaxed", update: str = "ema", **options) -> VectorQuantizer:
    """``H = 1, S = 3, d = 2``, fp64, the codebook :data:`CODES`, sampled assignment."""
    vq = VectorQuantizer(
        1, 3, 2, update=update, assignment="sampled", estimator=estimator, **{"temperature": 1.0, **options}
    ).double()
    with torch.no_grad():
        vq.embed.copy_(CODES[None])
    return vq


def hand_relaxation(temperature: float) -> tuple[torch.Tensor, torch.Tensor, float]:
    """By loops: the draw's noise ``g (N, S)`` (torch's generator seeded with :data:`SEED`, as the draw takes it:
    ``-log E``, ``E ~ Exp(1)`` in fp32), the relaxed code's weights ``y = softmax(ℓ + g) (N, S)`` with
    ``ℓ_s = -||k - C_s||² / scale``, and ``scale = τ·m``."""
    torch.manual_seed(SEED)
    noise = -torch.empty(1, len(KEYS), len(CODES)).exponential_().log()
    dist = [[float(((key - code) ** 2).sum()) for code in CODES] for key in KEYS]
    scale = temperature * sum(min(row) for row in dist) / len(KEYS)
    y = torch.empty(len(KEYS), len(CODES), dtype=torch.float64)
    for n, row in enumerate(dist):
        e = [
            torch.exp(torch.tensor(-d / scale + float(noise[0, n, s]), dtype=torch.float64))
            for s, d in enumerate(row)
        ]
        y[n] = torch.stack(e) / sum(e)
    return noise[0].double(), y, scale


def run(vq: VectorQuantizer, g_out: torch.Tensor, extra_loss: bool = False):
    """``vq`` on :data:`KEYS` after seeding with :data:`SEED`: ``(k_hat, codes, key gradient, codebook
    gradient or None)`` of ``Σ k_hat·g_out`` (plus the codebook loss with ``extra_loss``)."""
    k = KEYS[None, None].clone().requires_grad_(True)
    torch.manual_seed(SEED)
    k_hat, codes, aux = vq(k)
    loss = (k_hat * g_out).sum() + (aux["codebook_loss"] if extra_loss else 0)
    params = [k, *([vq.embed] if isinstance(vq.embed, torch.nn.Parameter) else [])]
    grads = torch.autograd.grad(loss, params)
    return k_hat, codes[0, 0], grads[0][0, 0], grads[1] if len(grads) > 1 else None


def upstream() -> torch.Tensor:
    g = torch.Generator().manual_seed(9)
    return torch.randn(1, 1, len(KEYS), 2, generator=g, dtype=torch.float64)


def test_the_value_is_the_drawn_code_the_straight_through_quantiser_draws() -> None:
    torch.manual_seed(0)
    k = torch.randn(3, 2, 40, 4, dtype=torch.float64, requires_grad=True)
    relaxed = VectorQuantizer(2, 6, 4, assignment="sampled", estimator="relaxed", temperature=2.0).double()
    plain = VectorQuantizer(2, 6, 4, assignment="sampled", temperature=2.0).double()
    plain.load_state_dict(relaxed.state_dict())
    torch.manual_seed(1)
    k_hat, codes, aux = relaxed(k)
    torch.manual_seed(1)
    k_hat_st, codes_st, aux_st = plain(k)
    assert torch.equal(codes, codes_st) and torch.equal(k_hat, k_hat_st)
    assert torch.equal(k_hat, torch.stack([relaxed.codebook[h][codes[:, h]] for h in range(2)], 1))
    assert all(torch.equal(aux[name], aux_st[name]) for name in aux)  # metrics and losses of the drawn codes
    assert torch.equal(relaxed.pending_count, plain.pending_count)
    nearest = torch.cdist(k.detach().transpose(0, 1).reshape(2, -1, 4), relaxed.codebook).argmin(-1)
    assert not torch.equal(codes.transpose(0, 1).reshape(2, -1), nearest)  # some keys drew another code
    # the draw exposed with its noise is sampled_code's draw, from the same generator state
    flat, codebook = k.detach().transpose(0, 1).reshape(2, -1, 4), relaxed.codebook
    torch.manual_seed(2)
    drawn, noise = sampled_code_and_noise(flat, codebook, nearest, 2.0)
    torch.manual_seed(2)
    assert torch.equal(drawn, sampled_code(flat, codebook, nearest, 2.0)) and noise.shape == (2, 120, 6)


def test_the_key_gradient_is_straight_through_plus_the_relaxation_by_hand() -> None:
    g_out = upstream()
    k_hat, codes, grad, _ = run(quantiser(temperature=2.0), g_out)
    noise, y, scale = hand_relaxation(2.0)
    dist = torch.cdist(KEYS, CODES) ** 2
    assert torch.equal(codes, (-dist / scale + noise).argmax(-1))  # the Gumbel-max draw on the same noise
    assert torch.equal(k_hat[0, 0], CODES[codes])
    want = torch.empty_like(KEYS)
    for n in range(len(KEYS)):
        g = g_out[0, 0, n]
        mean = sum(y[n, s] * CODES[s] for s in range(3))
        want[n] = g + 2 / scale * sum(y[n, s] * (CODES[s] - mean) * (CODES[s] @ g) for s in range(3))
    assert torch.allclose(grad, want, atol=1e-10, rtol=0)
    assert (grad - g_out[0, 0]).abs().max() > 1e-2  # the relaxation's term is there


def test_relaxed_code_is_the_softmax_weighted_code_with_its_gradient() -> None:
    noise, y, scale = hand_relaxation(1.0)
    x = KEYS[None].clone().requires_grad_(True)
    soft = relaxed_code(x, CODES[None], torch.tensor([[scale]]), noise[None])
    assert soft.dtype == torch.float64 and torch.allclose(soft[0], y @ CODES, atol=1e-12, rtol=0)
    float_soft = relaxed_code(KEYS[None].float(), CODES[None].float(), torch.tensor([[scale]]), noise[None])
    assert float_soft.dtype == torch.float32 and torch.allclose(float_soft[0].double(), y @ CODES, atol=1e-6)


def test_at_temperature_zero_and_in_evaluation_it_is_straight_through() -> None:
    g_out = upstream()
    vq = quantiser(temperature=2.0, temperature_anneal=1)
    _, _, grad, _ = run(vq, g_out)  # step 0: τ = 2 as a 0-d tensor, the relaxation is there
    _, _, want, _ = run(quantiser(temperature=2.0), g_out)  # the same with τ a number
    assert torch.allclose(grad, want, atol=1e-12, rtol=0) and not torch.equal(grad, g_out[0, 0])
    vq.update()
    assert float(vq.current_temperature()) == 0.0
    k_hat, codes, grad, _ = run(vq, g_out)
    nearest = torch.cdist(KEYS, vq.codebook[0]).argmin(-1)
    assert torch.equal(codes, nearest) and torch.equal(grad, g_out[0, 0])
    vq = quantiser(temperature=2.0).eval()
    _, codes, grad, _ = run(vq, g_out)
    assert torch.equal(codes, torch.cdist(KEYS, CODES).argmin(-1)) and torch.equal(grad, g_out[0, 0])


def test_trainable_codes_get_the_relaxation_gradient() -> None:
    """``update=gradient``: beyond the codebook loss (the same draw, the same loss under straight-through),
    ``C_r`` gets ``Σ_n y_nr [g_n + (2/scale)((C_r - c̄_n)·g_n)(k_n - C_r)]``, the relaxation's, by hand."""
    g_out = upstream()
    _, codes, _, grad = run(quantiser(update="gradient", temperature=2.0), g_out, extra_loss=True)
    _, codes_st, _, grad_st = run(quantiser("straight_through", "gradient", temperature=2.0), g_out, True)
    assert torch.equal(codes, codes_st)
    _, y, scale = hand_relaxation(2.0)
    want = torch.zeros_like(CODES)
    for n in range(len(KEYS)):
        g = g_out[0, 0, n]
        mean = sum(y[n, s] * CODES[s] for s in range(3))
        for r in range(3):
            want[r] += y[n, r] * (g + 2 / scale * ((CODES[r] - mean) @ g) * (KEYS[n] - CODES[r]))
    assert torch.allclose(grad[0] - grad_st[0], want, atol=1e-10, rtol=0)
    assert want.abs().max() > 1e-2
    # EMA codes are buffers: no gradient to take, and the key's gradient is the same relaxation
    vq = quantiser()
    assert not any(p.requires_grad for p in vq.parameters())


def test_relaxed_needs_the_sampled_assignment() -> None:
    with pytest.raises(ValueError, match="estimator='relaxed'.*assignment='sampled'"):
        VectorQuantizer(1, 4, 2, estimator="relaxed")
    with pytest.raises(ValueError, match="estimator"):
        VectorQuantizer(1, 4, 2, estimator="relaxed", assignment="nearest")
    VectorQuantizer(1, 4, 2, estimator="relaxed", assignment="sampled")


@pytest.mark.parametrize(("preset", "refused"), [("sampled", False), ("healthy", True)])
def test_the_config_override_validates_only_with_sampled(preset: str, refused: bool) -> None:
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(
            "train",
            overrides=[
                "experiment=recall_cpu",
                "model=gau_vq",
                f"codebook={preset}",
                "codebook.estimator=relaxed",
            ],
        )
    if refused:
        with pytest.raises(ValueError, match="estimator"):
            validate(cfg)
    else:
        validate(cfg)


T = 14


def attention(estimator: str = "relaxed"):
    torch.manual_seed(0)
    attn = build(
        "vq", d_k=4, d_v=3, heads=2, codebook_size=6, block_len=3, window_len=2, window_bias=True,
        codebook={"assignment": "sampled", "estimator": estimator, "temperature": 1.0},
    ).double()  # fmt: skip
    torch.nn.init.normal_(attn.bias.u)
    torch.nn.init.normal_(attn.bias.v)
    return attn.train()


def qkv() -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(7)
    return tuple(
        torch.randn(2, 2, T, d, generator=g, dtype=torch.float64).requires_grad_(True) for d in (4, 4, 3)
    )


def test_vq_attention_with_the_relaxed_estimator_is_dense_softmax_over_the_drawn_codes_and_causal() -> None:
    """In training the VQ kernel (window and cache) and the reference replay the same draw (the same seed):
    equal outputs and input gradients; the relaxation changes the key gradient only; causal."""
    attn = attention()
    q, k, v = qkv()
    out, g, grads = assert_equals_reference(attn, q, k, v, seed=11)
    plain = attention("straight_through")
    plain.load_state_dict(attn.state_dict())
    torch.manual_seed(11)
    out_st, _, _ = plain(q, k, v)
    st_grads = torch.autograd.grad((out_st * g).sum(), (q, k, v))
    assert torch.equal(out_st, out)
    assert torch.allclose(st_grads[2], grads[2], atol=1e-12) and (st_grads[1] - grads[1]).abs().max() > 1e-6
    x = torch.cat([q, k, v], -1)[:1].detach()
    torch.manual_seed(12)
    jac = torch.autograd.functional.jacobian(lambda y: attn(y[..., :4], y[..., 4:8], y[..., 8:])[0], x)
    per_pos = jac.abs().sum(dim=(0, 1, 3, 4, 5, 7))
    assert torch.all(per_pos.triu(1) == 0) and torch.all(per_pos.diagonal() > 0)
