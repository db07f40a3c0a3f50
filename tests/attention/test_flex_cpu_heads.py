"""Torch 2.14.1's compiled flex attention on CPU is wrong where the queries' and keys' heads are 8 or 16 wide
(:data:`~tvq_exp.attention.flex_runtime.FLEX_CPU_WRONG_KEY_DIMS`): the repro, with none of our code, against SDPA;
and the guard that keeps both flex backends off that kernel there (``kernel=auto`` takes the plain kernel,
``kernel=flex`` runs flex eagerly), their outputs equal to the plain kernel's."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

from tests.attention.backends import build
from tvq_exp.attention import flex_runtime
from tvq_exp.attention.flex_runtime import (
    FLEX_AVAILABLE,
    FLEX_CPU_WRONG_KEY_DIMS,
    FLEX_MIN_QUERIES,
    flex_support,
)

pytestmark = [
    pytest.mark.skipif(not FLEX_AVAILABLE, reason="torch has no flex_attention"),
    pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile"),
]


def _wrong_values(d_k: int, d_v: int, queries: int = 4, keys: int = 8, calls: int = 3) -> int:
    """The most wrong outputs of ``calls`` calls of torch's compiled flex attention on CPU: 12 items, one head,
    ``queries`` against ``keys`` under a causal mask (the extra keys in front), against SDPA with the same mask
    (which flex's eager form equals)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    gen = torch.Generator().manual_seed(0)
    q = torch.randn(12, 1, queries, d_k, generator=gen)
    k = torch.randn(12, 1, keys, d_k, generator=gen)
    v = torch.randn(12, 1, keys, d_v, generator=gen)
    past = keys - queries
    mask = create_block_mask(lambda b, h, i, j: j <= i + past, None, None, queries, keys, device="cpu")
    expected = F.scaled_dot_product_attention(
        q, k, v, attn_mask=torch.arange(keys) <= torch.arange(queries)[:, None] + past
    )
    kernel = torch.compile(flex_attention, dynamic=False, fullgraph=True)
    with torch.no_grad():
        outs = [kernel(q, k, v, block_mask=mask) for _ in range(calls)]
    return max(int((~torch.isclose(out, expected, atol=1e-5, rtol=1e-4)).sum()) for out in outs)


@pytest.mark.slow
def test_torchs_compiled_cpu_kernel_is_wrong_where_the_guard_says() -> None:
    """The upstream bug the guard stands for: wrong outputs at query/key heads of 8 and 16 (whatever the values'
    width), right around them. When this fails for a width of the guard's, torch has fixed it there: drop the width
    from ``FLEX_CPU_WRONG_KEY_DIMS``."""
    if not flex_support("cpu", compiled=True):
        pytest.skip(flex_support("cpu", compiled=True).reason)
    torch._dynamo.reset()
    with torch._dynamo.config.patch(recompile_limit=16):
        for d_k in FLEX_CPU_WRONG_KEY_DIMS:
            assert _wrong_values(d_k, 32) > 0, (
                f"torch's compiled CPU flex is right at d_k={d_k}: lift the guard"
            )
        for d_k, d_v in ((4, 4), (24, 24), (32, 8), (32, 32)):
            assert _wrong_values(d_k, d_v) == 0, (d_k, d_v)


@pytest.mark.parametrize("d_k", FLEX_CPU_WRONG_KEY_DIMS)
@pytest.mark.parametrize("backend", ["vq", "dense"])
def test_narrow_key_heads_keep_off_the_compiled_cpu_kernel(
    backend: str, d_k: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Inference of 128 queries on CPU, where ``auto`` would take the compiled kernel: with query/key heads of 8 or
    16 it takes the plain kernel, and ``flex`` runs flex eagerly; both equal ``plain``, and no compiled kernel is
    asked for. The refusal names the heads."""
    reason = flex_support("cpu", compiled=True, head_dims=(d_k, d_k, 6)).reason
    assert f"query/key heads of 8 or 16 (torch {torch.__version__}; q, k, v: {d_k}, {d_k}, 6)" in reason

    def no_compiled_kernel(*args: object) -> None:
        raise AssertionError("the compiled CPU flex kernel was asked for")

    monkeypatch.setattr(flex_runtime, "compiled_kernel", no_compiled_kernel)
    torch.manual_seed(0)
    options = {"codebook_size": 5, "block_len": 4} if backend == "vq" else {}
    layers = {
        kernel: build(backend, d_k=d_k, d_v=6, kernel=kernel, **options)
        for kernel in ("plain", "auto", "flex")
    }
    for layer in layers.values():
        layer.load_state_dict(layers["plain"].state_dict())
        layer.eval()
    gen = torch.Generator().manual_seed(1)
    q, k = (torch.randn(2, 1, FLEX_MIN_QUERIES, d_k, generator=gen) for _ in range(2))
    v = torch.randn(2, 1, FLEX_MIN_QUERIES, 6, generator=gen)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        outs = {kernel: layer(q, k, v)[0] for kernel, layer in layers.items()}
    assert layers["auto"].last_kernel == "plain" and layers["flex"].last_kernel == "flex"
    torch.testing.assert_close(outs["auto"], outs["plain"], rtol=0, atol=0)
    torch.testing.assert_close(outs["flex"], outs["plain"], rtol=1e-5, atol=1e-5)
