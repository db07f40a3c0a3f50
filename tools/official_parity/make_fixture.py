"""Make tests/fixtures/official/vq_gau_fp32.npz from the OFFICIAL Transformer-VQ layer (JAX, legacy branch).

Runs in its own environment (see README.md beside this file), never in the project's. The official
``VQAttention`` (one GAU with VQ attention, ``nn/attn.py``) in fp32 and evaluation mode (no dropout, no
commitment / codebook losses), driven as the official code drives it:

- inside a segment (the official "update", ``update_len``), ``nn.scan`` over its blocks of ``block_len`` tokens
  with the state carried from block to block, exactly as ``TransformerLayer`` in ``nn/model.py`` scans it; the
  layer's own ``update_state`` stops gradients through the state unless ``grad_thru_cache``;
- across segments (TBPTT), the state after one segment is the next one's initial state under a stop-gradient,
  as ``ops/train.py`` carries ``attn_state``.

Configurations ``<cfg>`` (``CONFIGS``): with / without the compressive cache (``agg_cache``), with / without
gradients through the state inside a segment (``grad_thru_cache``), one and two heads. Sizes: B 2, d_model 32,
d_k 16 (8 per head with two heads), d_v 64 in all, L = mem_len 8, S 8, 3 segments of 3 blocks. The file holds

- ``param.h<n_head>.<flax name>``: every parameter (flattened with ``.``), shared by the configurations with
  as many heads; biases ``u, v``, the RMS norm's gain and bias and the codebook counts are randomised (their
  initialisations are zeros / ones, which would hide a mapping mistake);
- ``x``, ``w`` (shared): inputs ``(B, T, d_model)`` and the weights of the loss, ``T = SEGMENTS · K · L``;
- per segment ``i``: ``<cfg>.out.<i>`` the layer's output (the residual branch ``res``, ``(B, K·L, d_model)``),
  ``<cfg>.grad_x.<i>`` and ``<cfg>.grad.<i>.<flax name>``: gradients of ``sum(res · w)`` over the segment with
  respect to the segment's input and every parameter, and the state after the segment:
  ``<cfg>.state.<i>.{pos_offset, z, k_hat, v, lower, upper_div_lower}`` (``xlcache`` and ``aggcache`` as the
  official keeps them; ``doc_ids`` / ``latest_doc_id`` are all zero here and not saved).

    python tools/official_parity/make_fixture.py /path/to/official/src tests/fixtures/official/vq_gau_fp32.npz
"""

from __future__ import annotations

import sys

import numpy as np

sys.path.insert(0, sys.argv[1])

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from flax.core import freeze, unfreeze  # noqa: E402
from flax.traverse_util import flatten_dict  # noqa: E402
from transformer_vq.nn.attn import VQAttention  # noqa: E402
from transformer_vq.nn.grad import sg  # noqa: E402
from transformer_vq.nn.types import TransformerConfig  # noqa: E402

B, L, S, K, SEGMENTS = 2, 8, 8, 3, 3  # batch, block_len (= mem_len), codes, blocks per segment, segments
D_MODEL, D_V_TOTAL = 32, 64  # d_v of all heads together (the GAU's expansion 2)
# name: (agg_cache, grad_thru_cache, n_head, d_k per head)
CONFIGS = {
    "cache": (True, False, 1, 16),
    "nocache": (False, False, 1, 16),
    "cache_gtc": (True, True, 1, 16),
    "nocache_gtc": (False, True, 1, 16),
    "cache_h2": (True, False, 2, 8),
}
jax.config.update("jax_enable_x64", False)


def config(agg_cache: bool, grad_thru_cache: bool, n_head: int, d_k: int) -> TransformerConfig:
    return TransformerConfig.create(
        param_dtype="float32",
        dtype="float32",
        global_batch_size=B,
        sequence_len=L * K * SEGMENTS,
        update_len=L * K,
        block_len=L,
        mem_len=L,
        grad_thru_cache=grad_thru_cache,
        agg_cache=agg_cache,
        d_model=D_MODEL,
        d_k=d_k,
        d_v=D_V_TOTAL // n_head,
        d_ff=0,
        n_head=n_head,
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


def scanned(cfg: TransformerConfig) -> nn.Module:
    """The layer scanned over the blocks of a segment, with ``TransformerLayer``'s scan arguments."""
    return nn.scan(
        VQAttention,
        variable_broadcast="params",
        split_rngs=dict(params=False, timeless=False, ephemeral=True),
        in_axes=0,
        out_axes=0,
    )(cfg)


def to_blocks(a: jnp.ndarray) -> jnp.ndarray:
    """``(B, K·L, D)`` -> ``(K, B, L, D)``: the official model's block-major layout."""
    return jnp.transpose(jnp.reshape(a, (B, K, L, -1)), (1, 0, 2, 3))


def from_blocks(a: jnp.ndarray) -> jnp.ndarray:
    return jnp.reshape(jnp.transpose(a, (1, 0, 2, 3)), (B, K * L, -1))


def run(name: str, out: dict[str, np.ndarray]) -> None:
    cfg = config(*CONFIGS[name])
    n_head, d_k = cfg.n_head, cfg.d_k
    layer = scanned(cfg)
    rng = np.random.default_rng(0)  # the same inputs for every configuration
    x = rng.standard_normal((B, L * K * SEGMENTS, D_MODEL)).astype(np.float32)
    w = rng.standard_normal((B, L * K * SEGMENTS, D_MODEL)).astype(np.float32)
    rng = np.random.default_rng(n_head)  # the same parameters for the configurations with as many heads
    doc_ids = jnp.zeros((K, B, L), jnp.int32)
    state = VQAttention.initial_state(cfg, B)

    def inputs(xs: jnp.ndarray) -> dict:
        # vq_spec is only read in training (losses); None keeps it out of the scan
        return dict(input_features=to_blocks(xs), doc_ids=doc_ids, vq_spec=None)

    params = layer.init(
        {"params": jax.random.PRNGKey(n_head), "timeless": jax.random.PRNGKey(1), "ephemeral": jax.random.PRNGKey(2)},
        state, inputs(jnp.asarray(x[:, : K * L])),
    )  # fmt: skip
    params = unfreeze(params)
    p = params["params"]
    # randomise what starts as ones / zeros, so a swapped or dropped mapping shows
    p["quantizer"]["c_count"] = jnp.asarray(rng.uniform(0.5, 3.0, size=(n_head, S)).astype(np.float32))
    p["u"] = jnp.asarray(rng.standard_normal(n_head * d_k).astype(np.float32))
    p["v"] = jnp.asarray(rng.standard_normal(n_head * d_k).astype(np.float32))
    p["input_ln"]["g"] = jnp.asarray(rng.uniform(0.5, 1.5, size=D_MODEL).astype(np.float32))
    p["input_ln"]["b"] = jnp.asarray(0.1 * rng.standard_normal(D_MODEL).astype(np.float32))
    params = freeze(params)
    for key, value in flatten_dict(unfreeze(params)["params"], sep=".").items():
        prev = out.setdefault(f"param.h{n_head}.{key}", np.asarray(value))
        assert np.array_equal(prev, np.asarray(value)), key
    out["x"], out["w"] = x, w

    def segment(prm, xs, ws, st):
        new_state, res = layer.apply(prm, st, inputs(xs))
        res = from_blocks(res["res"])
        return jnp.sum(res * ws), (res, new_state)

    grad = jax.jit(jax.grad(segment, argnums=(0, 1), has_aux=True))
    for i in range(SEGMENTS):
        sl = slice(i * K * L, (i + 1) * K * L)
        (g_params, g_x), (res, new_state) = grad(params, jnp.asarray(x[:, sl]), jnp.asarray(w[:, sl]), state)
        out[f"{name}.out.{i}"] = np.asarray(res)
        out[f"{name}.grad_x.{i}"] = np.asarray(g_x)
        for key, value in flatten_dict(unfreeze(g_params)["params"], sep=".").items():
            out[f"{name}.grad.{i}.{key}"] = np.asarray(value)
        state = jax.tree_util.tree_map(sg, new_state)  # the TBPTT carry of ops/train.py
        out[f"{name}.state.{i}.pos_offset"] = np.asarray(state["pos_offset"])
        out[f"{name}.state.{i}.z"] = np.asarray(state["xlcache"]["z"])
        out[f"{name}.state.{i}.k_hat"] = np.asarray(state["xlcache"]["k_hat"])
        out[f"{name}.state.{i}.v"] = np.asarray(state["xlcache"]["v"])
        out[f"{name}.state.{i}.lower"] = np.asarray(state["aggcache"]["lower"])
        out[f"{name}.state.{i}.upper_div_lower"] = np.asarray(state["aggcache"]["upper_div_lower"])


if __name__ == "__main__":
    arrays: dict[str, np.ndarray] = {}
    for name in CONFIGS:
        run(name, arrays)
    np.savez_compressed(sys.argv[2], **arrays)
    print(f"{sys.argv[2]}: {len(arrays)} arrays, jax {jax.__version__}")
