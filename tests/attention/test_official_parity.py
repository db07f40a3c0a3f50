"""Parity with the official Transformer-VQ layer (JAX, legacy branch): its outputs, carried state and gradients,
saved by ``tools/official_parity/make_fixture.py`` (run in its own environment with jax 0.4.13 / flax 0.6.11), are
reproduced by our GAU block with VQ attention once the official parameters are mapped in (fp32, 6 blocks of
L = 4 with the state carried, with the cache and with ``agg_cache=0`` / ``use_cache=false``).

Compared: every block's output (the official layer returns the residual branch; ours adds ``x``), the cache counts
and means and the window's quantised keys and values after every block, and per block the gradients of
``sum(out * w)`` with respect to the block's input and every mapped parameter (the carried state a constant on
both sides). Not compared: gradients of the codebook (the official reads it through a stop-gradient; ours keeps it
in buffers), and training-only terms (dropout, commitment and codebook losses: the fixture is in eval mode).
"""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
import torch

from tests.helpers.paths import REPO
from tvq_exp.attention.registry import build_attention
from tvq_exp.models.blocks import GAUBlock

FIXTURE = REPO / "tests" / "fixtures" / "official" / "vq_gau_fp32.npz"
B, L, D_MODEL, D_K, S, BLOCKS = 2, 4, 16, 8, 6, 6
D_V = 2 * D_MODEL
TOL = 1e-5


def official() -> dict[str, np.ndarray]:
    with np.load(FIXTURE) as data:
        return {key: data[key] for key in data.files}


def mapped_block(p: dict[str, np.ndarray], use_cache: bool) -> GAUBlock:
    """Our block with the official parameters (``param.<official name>``) copied in."""
    attention = partial(
        build_attention, "vq", codebook_size=S, block_len=L, window_bias=True, use_cache=use_cache
    )
    block = GAUBlock(D_MODEL, attention, d_k=D_K, expansion=2, heads=1, position="xl").eval()
    t = lambda name: torch.from_numpy(p[f"param.{name}"].copy())  # noqa: E731
    kvg = t("kvg_proj.kernel")  # (d_model, d_k + d_v + d_v): k | v | g
    c_sum, c_count = t("quantizer.c_sum"), t("quantizer.c_count")
    with torch.no_grad():
        block.norm.weight.copy_(t("input_ln.g"))
        block.norm.bias.copy_(t("input_ln.b"))
        block.w_qk.weight.copy_(torch.cat([t("q_proj.kernel").T, kvg[:, :D_K].T]))  # rows: q | k
        block.w_vg.weight.copy_(kvg[:, D_K:].T)  # rows: v | g
        block.w_o.weight.copy_(t("res_proj.kernel").T)
        block.attn.bias.proj.weight.copy_(t("r_proj.kernel").T)
        block.attn.bias.u.copy_(t("u")[None])
        block.attn.bias.v.copy_(t("v")[None])
        quantizer = block.attn.quantizer
        quantizer.ema_sum.copy_(c_sum)
        quantizer.ema_count.copy_(c_count)
        quantizer.embed.copy_(c_sum / c_count.clamp_min(0.01)[..., None])  # the official read-out
        quantizer.initialized.fill_(True)
    return block


def our_grads(block: GAUBlock) -> dict[str, torch.Tensor]:
    """Our parameter gradients under the official names (layouts mapped back)."""
    w_qk, w_vg = block.w_qk.weight.grad, block.w_vg.weight.grad
    return {
        "input_ln.g": block.norm.weight.grad,
        "input_ln.b": block.norm.bias.grad,
        "q_proj.kernel": w_qk[:D_K].T,
        "kvg_proj.kernel": torch.cat([w_qk[D_K:], w_vg]).T,
        "res_proj.kernel": block.w_o.weight.grad.T,
        "r_proj.kernel": block.attn.bias.proj.weight.grad.T,
        "u": block.attn.bias.u.grad[0],
        "v": block.attn.bias.v.grad[0],
    }


def close(ours: torch.Tensor, theirs: np.ndarray, what: str) -> None:
    ours = ours.detach().double().numpy()
    scale = max(1.0, float(np.abs(theirs).max()))
    err = float(np.abs(ours - theirs).max()) / scale
    assert ours.shape == theirs.shape and err < TOL, (
        f"{what}: max error {err:.2e} (shape {ours.shape} vs {theirs.shape})"
    )


@pytest.mark.parametrize("use_cache", [True, False], ids=["cache", "nocache"])
def test_our_layer_reproduces_the_official_outputs_state_and_gradients(use_cache: bool) -> None:
    p = official()
    prefix = "cache" if use_cache else "nocache"
    block = mapped_block(p, use_cache)
    x_all, w_all = torch.from_numpy(p["x"]), torch.from_numpy(p["w"])
    state = None
    for i in range(BLOCKS):
        x = x_all[:, i * L : (i + 1) * L].clone().requires_grad_(True)
        block.zero_grad()
        y, state, _ = block(x, state)
        res = y - x  # the official layer returns the residual branch only
        (res * w_all[:, i * L : (i + 1) * L]).sum().backward()
        close(res, p[f"{prefix}.out.{i}"], f"output of block {i}")
        close(x.grad, p[f"{prefix}.grad_x.{i}"], f"input gradient of block {i}")
        for name, grad in our_grads(block).items():
            close(grad, p[f"{prefix}.grad.{i}.{name}"], f"gradient of {name}, block {i}")
        attn = state["attn"]
        close(attn["k"], p[f"{prefix}.state.{i}.k_hat"], f"window keys after block {i}")
        close(attn["v"], p[f"{prefix}.state.{i}.v"], f"window values after block {i}")
        if use_cache:
            close(attn["cache_n"], p[f"{prefix}.state.{i}.lower"], f"cache counts after block {i}")
            close(attn["cache_mu"], p[f"{prefix}.state.{i}.upper_div_lower"], f"cache means after block {i}")
        state = {**state, "attn": {k: v.detach() if torch.is_tensor(v) else v for k, v in attn.items()}}
