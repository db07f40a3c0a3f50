"""Parity with the official Transformer-VQ layer (JAX, ``legacy`` branch, ``nn/attn.py``).

The fixture ``tests/fixtures/official/vq_gau_fp32.npz`` is written by ``tools/official_parity/make_fixture.py``
in its own environment (jax 0.4.13, flax 0.6.11; see the README beside it): the official ``VQAttention`` (one
GAU with VQ attention) in fp32 and eval mode, 3 segments of K = 3 blocks (L = mem_len = 8), the blocks of a
segment scanned as the official ``TransformerLayer`` scans them, the state carried across segments under a
stop-gradient as the official ``train_op`` carries it (TBPTT). Configurations: with / without the compressive
cache (``agg_cache``), ``grad_thru_cache`` 0 / 1, one head / two heads.

Ours: a :class:`GAUBlock` with ``build_attention("vq", ...)`` (``use_cache = agg_cache``,
``grad_through_cache = grad_thru_cache``), the official parameters copied in (:func:`mapped_block`), one call
per segment (all of its blocks at once) with our state carried (ours detaches it between calls). With K = 3 the
third block of a segment reads the cache of the segment's first block inside the same call, so with
``grad_thru_cache`` the gradient through the cache means is compared too, besides the one through the previous
block's keys and values in the window.

Compared, per segment, to 1e-5 (max absolute error divided by ``max(1, max |official|)``):

- the output: the official layer returns the residual branch ``res``; ours returns ``x + res``, so ``y - x``;
- gradients of ``sum(res · w)`` over the segment w.r.t. the segment's input and every mapped parameter
  (layouts mapped back to the official names);
- the carried state: window keys ``xlcache.k_hat`` / values ``xlcache.v`` / codes ``xlcache.z`` (ours ``k``,
  ``v``, ``codes``: the last block), the position ``pos_offset`` (ours ``t``), and with the cache the counts
  ``aggcache.lower`` and means ``aggcache.upper_div_lower`` (ours ``cache_n``, ``cache_mu``).

Equivalent rather than equal:

- codebook gradients: the official layer reads the codebook through a stop-gradient (``c_sum`` / ``c_count``
  are trained only by the EMA surrogate ``l_codebook``, which is zero in eval mode), so its gradients are
  exactly zero; ours keeps the codebook in buffers (no gradient at all). Checked: the official ones are all
  zero and our quantizer has no trainable parameter.
- without the cache (``agg_cache=0``) the official layer still accumulates ``aggcache`` in its state but never
  reads it; ours keeps no cache then. Checked: ours has no cache entries; the official ``aggcache`` is not
  compared in those configurations.

Not compared: ``xlcache.doc_ids`` / ``aggcache.latest_doc_id`` (all zero: one document; ours has no document
ids) and the training-only terms (dropout, commitment and codebook losses, metrics).
"""

from __future__ import annotations

import ast
from functools import cache, partial

import numpy as np
import pytest
import torch

from tests.helpers.paths import REPO
from tvq_exp.attention.registry import build_attention
from tvq_exp.models.blocks import GAUBlock

FIXTURE = REPO / "tests" / "fixtures" / "official" / "vq_gau_fp32.npz"
GENERATOR = REPO / "tools" / "official_parity" / "make_fixture.py"


def _generator_constants() -> dict[str, object]:
    """The sizes and CONFIGS the fixture was made with, read from the generator's source (it imports JAX and
    the official code, which this environment does not have, so it is parsed, not imported)."""
    found: dict[str, object] = {}
    for node in ast.parse(GENERATOR.read_text()).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            names = (
                [e.id for e in target.elts] if isinstance(target, ast.Tuple) else [getattr(target, "id", "")]
            )
            if set(names) & {"B", "D_MODEL", "CONFIGS"}:
                value = ast.literal_eval(node.value)
                found.update(zip(names, value, strict=True) if len(names) > 1 else [(names[0], value)])
    return found


_MADE_WITH = _generator_constants()
# batch, block_len (= the official mem_len), codes, blocks per segment (one call of ours), segments
B, L, S, K, SEGMENTS = (int(_MADE_WITH[n]) for n in ("B", "L", "S", "K", "SEGMENTS"))  # type: ignore[call-overload]
D_MODEL, D_V_TOTAL = int(_MADE_WITH["D_MODEL"]), int(_MADE_WITH["D_V_TOTAL"])  # type: ignore[call-overload]
# name -> (agg_cache = use_cache, grad_thru_cache = grad_through_cache, heads, d_k per head)
CONFIGS: dict[str, tuple[bool, bool, int, int]] = _MADE_WITH["CONFIGS"]  # type: ignore[assignment]
TOL = 1e-5
PARAMS = (
    "input_ln.g",
    "input_ln.b",
    "q_proj.kernel",
    "kvg_proj.kernel",
    "res_proj.kernel",
    "r_proj.kernel",
    "u",
    "v",
)


@cache
def official() -> dict[str, np.ndarray]:
    with np.load(FIXTURE) as data:
        return {key: data[key] for key in data.files}


def mapped_block(name: str) -> GAUBlock:
    """Our block with the official parameters ``param.h<H>.<official name>`` copied in.

    Official (flax ``Dense`` kernels are ``(in, out)``; ours ``nn.Linear`` weights ``(out, in)``: transposed):

    ============================  ====================  =========================================================
    official name, shape          ours                  how
    ============================  ====================  =========================================================
    input_ln.g, b  (d_model,)     norm.weight, bias     as is (RMS norm with gain and bias, eps 1e-6, both sides)
    q_proj.kernel  (d_model, H·dk)  w_qk.weight[:H·dk]  ``.T``; rows head-major (official reshape ``[H, d_k]``)
    kvg_proj.kernel               w_qk.weight[H·dk:]    columns ``[:H·dk]`` (k), ``.T``
      (d_model, H·dk + 2·H·dv)    w_vg.weight           columns ``[H·dk:]`` (v | g, each ``H·d_v`` head-major), ``.T``
    res_proj.kernel (H·dv, d_model)  w_o.weight         ``.T``
    r_proj.kernel  (d_model, H·dk)   attn.bias.proj.weight  ``.T`` (sinusoids of width d_model on both sides)
    u, v           (H·dk,)        attn.bias.u, v (H, dk)  reshape ``(H, d_k)``; both sides scale by ``d_k^-1/4``
    quantizer.c_sum (H, S, dk)    quantizer.ema_sum     as is
    quantizer.c_count (H, S)      quantizer.ema_count   as is; ``embed = c_sum / max(c_count, 0.01)``, the
                                                        official read-out (``LearnableVQ._get_codebook``)
    ============================  ====================  =========================================================
    """
    use_cache, gtc, heads, d_k = CONFIGS[name]
    p = official()
    attention = partial(
        build_attention, "vq", codebook_size=S, block_len=L, use_cache=use_cache,
        grad_through_cache=gtc,
    )  # fmt: skip
    block = GAUBlock(
        d_model=D_MODEL,
        attention=attention,
        d_k=d_k,
        expansion=D_V_TOTAL // D_MODEL,
        heads=heads,
        position="xl",
    )
    block = block.eval()
    t = lambda key: torch.from_numpy(p[f"param.h{heads}.{key}"].copy())  # noqa: E731
    hk = heads * d_k
    kvg = t("kvg_proj.kernel")  # (d_model, H·d_k + H·d_v + H·d_v): k | v | g
    assert kvg.shape == (D_MODEL, hk + 2 * D_V_TOTAL)
    c_sum, c_count = t("quantizer.c_sum"), t("quantizer.c_count")
    with torch.no_grad():
        block.norm.weight.copy_(t("input_ln.g"))
        block.norm.bias.copy_(t("input_ln.b"))
        block.w_qk.weight.copy_(torch.cat([t("q_proj.kernel").T, kvg[:, :hk].T]))  # rows: q | k
        block.w_vg.weight.copy_(kvg[:, hk:].T)  # rows: v | g
        block.w_o.weight.copy_(t("res_proj.kernel").T)
        block.attn.bias.proj.weight.copy_(t("r_proj.kernel").T)
        block.attn.bias.u.copy_(t("u").view(heads, d_k))
        block.attn.bias.v.copy_(t("v").view(heads, d_k))
        quantizer = block.attn.quantizer
        quantizer.ema_sum.copy_(c_sum)
        quantizer.ema_count.copy_(c_count)
        quantizer.embed.copy_(c_sum / c_count.clamp_min(0.01)[..., None])  # the official read-out
        quantizer.initialized.fill_(True)
    return block


def our_grads(block: GAUBlock, heads: int, d_k: int) -> dict[str, torch.Tensor]:
    """Our parameter gradients under the official names (layouts mapped back, the inverse of :func:`mapped_block`)."""
    w_qk, w_vg, hk = block.w_qk.weight.grad, block.w_vg.weight.grad, heads * d_k
    return {
        "input_ln.g": block.norm.weight.grad,
        "input_ln.b": block.norm.bias.grad,
        "q_proj.kernel": w_qk[:hk].T,
        "kvg_proj.kernel": torch.cat([w_qk[hk:], w_vg]).T,
        "res_proj.kernel": block.w_o.weight.grad.T,
        "r_proj.kernel": block.attn.bias.proj.weight.grad.T,
        "u": block.attn.bias.u.grad.reshape(-1),
        "v": block.attn.bias.v.grad.reshape(-1),
    }


@cache
def ours(name: str) -> dict[str, np.ndarray]:
    """Our block over the fixture's segments, under the fixture's keys (``<cfg>.out.<i>``, ...)."""
    use_cache, _, heads, d_k = CONFIGS[name]
    p = official()
    block = mapped_block(name)
    assert not any(p.requires_grad for p in block.attn.quantizer.parameters())
    x_all, w_all = torch.from_numpy(p["x"]), torch.from_numpy(p["w"])
    got: dict[str, np.ndarray] = {}
    state = None
    for i in range(SEGMENTS):
        sl = slice(i * K * L, (i + 1) * K * L)
        x = x_all[:, sl].clone().requires_grad_(True)
        block.zero_grad(set_to_none=True)
        y, state, _ = block(x, state)  # one call: the segment's K blocks at once
        res = y - x  # the official layer returns the residual branch only
        (res * w_all[:, sl]).sum().backward()
        got[f"{name}.out.{i}"] = res.detach().double().numpy()
        got[f"{name}.grad_x.{i}"] = x.grad.double().numpy()
        for key, grad in our_grads(block, heads, d_k).items():
            got[f"{name}.grad.{i}.{key}"] = grad.double().numpy()
        attn = state.attn
        got[f"{name}.state.{i}.pos_offset"] = np.asarray(attn.position)
        got[f"{name}.state.{i}.z"] = attn.codes.numpy()
        got[f"{name}.state.{i}.k_hat"] = attn.k.double().numpy()
        got[f"{name}.state.{i}.v"] = attn.v.double().numpy()
        assert (attn.cache_n is not None) == (attn.cache_mu is not None) == use_cache
        if use_cache:
            got[f"{name}.state.{i}.lower"] = attn.cache_n.double().numpy()
            got[f"{name}.state.{i}.upper_div_lower"] = attn.cache_mu.double().numpy()
        assert state.position == attn.position
    return got


def compare(name: str, keys: list[str]) -> float:
    """Largest scaled error over ``keys``; fails on the first key off by more than ``TOL``."""
    p, got, worst = official(), ours(name), 0.0
    for key in keys:
        theirs, mine = p[key].astype(np.float64), got[key]
        assert mine.shape == theirs.shape, f"{key}: shape {mine.shape} vs official {theirs.shape}"
        err = float(np.abs(mine - theirs).max()) / max(1.0, float(np.abs(theirs).max()))
        assert err < TOL, f"{key}: max scaled error {err:.2e}"
        worst = max(worst, err)
    return worst


QUANTITIES = {
    "out": lambda n: [f"{n}.out.{i}" for i in range(SEGMENTS)],
    "grad_x": lambda n: [f"{n}.grad_x.{i}" for i in range(SEGMENTS)],
    "grad_params": lambda n: [f"{n}.grad.{i}.{k}" for i in range(SEGMENTS) for k in PARAMS],
    "window_state": lambda n: [
        f"{n}.state.{i}.{k}" for i in range(SEGMENTS) for k in ("pos_offset", "z", "k_hat", "v")
    ],
    "cache_state": lambda n: [
        f"{n}.state.{i}.{k}" for i in range(SEGMENTS) for k in ("lower", "upper_div_lower")
    ],
}
CASES = [
    (name, quantity)
    for name, (use_cache, *_) in CONFIGS.items()
    for quantity in QUANTITIES
    if use_cache or quantity != "cache_state"  # no cache: the official aggcache is never read (see above)
]


@pytest.mark.parametrize(("name", "quantity"), CASES, ids=[f"{n}-{q}" for n, q in CASES])
def test_our_layer_reproduces_the_official_layer(name: str, quantity: str) -> None:
    worst = compare(name, QUANTITIES[quantity](name))
    print(f"{name} {quantity}: max scaled error {worst:.2e}")


@pytest.mark.parametrize("name", list(CONFIGS))
def test_the_official_codebook_gets_no_gradient(name: str) -> None:
    """The official codebook is read through a stop-gradient (ours: buffers, checked in :func:`ours`)."""
    p = official()
    for i in range(SEGMENTS):
        for key in ("quantizer.c_sum", "quantizer.c_count"):
            assert not np.any(p[f"{name}.grad.{i}.{key}"]), f"{name}: official gradient of {key} is not zero"
    ours(name)


def test_the_fixture_covers_every_official_parameter() -> None:
    """Every parameter the official layer has is mapped (or is the codebook, compared as above)."""
    p = official()
    for heads in {h for *_, h, _ in CONFIGS.values()}:
        names = {k.removeprefix(f"param.h{heads}.") for k in p if k.startswith(f"param.h{heads}.")}
        assert names == {*PARAMS, "quantizer.c_sum", "quantizer.c_count"}
