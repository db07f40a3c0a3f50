"""Make tests/fixtures/official/vq_gau_fp32.npz from the OFFICIAL Transformer-VQ layer (JAX, legacy branch).

Runs in its own environment (see README.md beside this file), never in the project's: the official
``VQAttention`` (one GAU with VQ attention) in fp32, evaluation mode (no dropout), over 6 blocks of L tokens with
its state carried from block to block, as the official model scans them. Saved: every parameter, the inputs, the
output of every block, the state after every block (cache counts ``lower``, cache means ``upper_div_lower``, the
window's ``k_hat`` and ``v``), and per block the gradients of ``sum(out * w)`` with respect to the block's input
and every parameter (the carried state a constant, as the official stop-gradient / our detached state).

    python tools/official_parity/make_fixture.py /path/to/official/src tests/fixtures/official/vq_gau_fp32.npz
"""

from __future__ import annotations

import sys

import numpy as np

sys.path.insert(0, sys.argv[1])

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from flax.core import unfreeze  # noqa: E402
from flax.traverse_util import flatten_dict  # noqa: E402
from transformer_vq.nn.attn import VQAttention  # noqa: E402
from transformer_vq.nn.types import TransformerConfig  # noqa: E402

B, L, D_MODEL, D_K, S, BLOCKS = 2, 4, 16, 8, 6, 6
D_V = 2 * D_MODEL
jax.config.update("jax_enable_x64", False)


class Spec:
    loss_mask = None


def config(agg_cache: bool) -> TransformerConfig:
    return TransformerConfig.create(
        param_dtype="float32",
        dtype="float32",
        global_batch_size=B,
        sequence_len=L * BLOCKS,
        update_len=L * BLOCKS,
        block_len=L,
        mem_len=L,
        grad_thru_cache=False,
        agg_cache=agg_cache,
        d_model=D_MODEL,
        d_k=D_K,
        d_v=D_V,
        d_ff=0,
        n_head=1,
        n_code=S,
        n_layer=1,
        n_vocab=256,
        pe_abs=False,
        pe_lam=100_000.0,
        p_dropemb=0.0,
        p_dropsin=0.0,
        p_dropres=0.0,
        p_droplyr=0.0,
        p_nucleus=1.0,
        c_beta=1e-4,
        c_gamma=0.99,
        e_tie=False,
        e_preln=False,
        e_scale="none",
        is_train=False,
    )


def run(agg_cache: bool, out: dict[str, np.ndarray]) -> None:
    cfg = config(agg_cache)
    layer = VQAttention(cfg)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((B, L * BLOCKS, D_MODEL)).astype(np.float32)
    w = rng.standard_normal((B, L * BLOCKS, D_MODEL)).astype(np.float32)
    state = VQAttention.initial_state(cfg, B)
    doc_ids = jnp.zeros((B, L), jnp.int32)
    params = layer.init(
        {"params": jax.random.PRNGKey(0), "timeless": jax.random.PRNGKey(1), "ephemeral": jax.random.PRNGKey(2)},
        state, dict(input_features=jnp.asarray(x[:, :L]), doc_ids=doc_ids, vq_spec=Spec()),
    )  # fmt: skip
    # a codebook with spread-out usage counts (the official init has counts of one)
    params = unfreeze(params)
    counts = rng.uniform(0.5, 3.0, size=(1, S)).astype(np.float32)
    params["params"]["quantizer"]["c_count"] = jnp.asarray(counts)
    # the XL biases' u, v start at zero: random values, so their mapping is tested too
    params["params"]["u"] = jnp.asarray(rng.standard_normal(D_K).astype(np.float32))
    params["params"]["v"] = jnp.asarray(rng.standard_normal(D_K).astype(np.float32))
    prefix = "cache" if agg_cache else "nocache"
    if agg_cache:
        for key, value in flatten_dict(params["params"], sep=".").items():
            out[f"param.{key}"] = np.asarray(value)
        out["x"], out["w"] = x, w

    def block(p, xb, wb, st):
        new_state, res = layer.apply(p, st, dict(input_features=xb, doc_ids=doc_ids, vq_spec=Spec()))
        return jnp.sum(res["res"] * wb), (res["res"], new_state)

    grad = jax.grad(block, argnums=(0, 1), has_aux=True)
    for i in range(BLOCKS):
        xb, wb = jnp.asarray(x[:, i * L : (i + 1) * L]), jnp.asarray(w[:, i * L : (i + 1) * L])
        (g_params, g_x), (res, new_state) = grad(params, xb, wb, state)
        out[f"{prefix}.out.{i}"] = np.asarray(res)
        out[f"{prefix}.grad_x.{i}"] = np.asarray(g_x)
        for key, value in flatten_dict(g_params["params"], sep=".").items():
            out[f"{prefix}.grad.{i}.{key}"] = np.asarray(value)
        state = new_state
        out[f"{prefix}.state.{i}.lower"] = np.asarray(state["aggcache"]["lower"])
        out[f"{prefix}.state.{i}.upper_div_lower"] = np.asarray(state["aggcache"]["upper_div_lower"])
        out[f"{prefix}.state.{i}.k_hat"] = np.asarray(state["xlcache"]["k_hat"])
        out[f"{prefix}.state.{i}.v"] = np.asarray(state["xlcache"]["v"])


if __name__ == "__main__":
    arrays: dict[str, np.ndarray] = {}
    run(True, arrays)
    run(False, arrays)
    np.savez_compressed(sys.argv[2], **arrays)
    print(f"{sys.argv[2]}: {len(arrays)} arrays, jax {jax.__version__}")
