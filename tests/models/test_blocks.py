"""Multi-head options (key_size, talking heads, grouped / multi-query keys-values), causality of
every backend in every block by Jacobian, and the new model presets (compose + train on real text)."""

from __future__ import annotations

import copy
import functools
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir
from hydra.errors import InstantiationException
from hydra.utils import instantiate

from tests.attention.backends import NAMES, backend_class, build, small_options
from tests.attention.test_flash_chunk import with_random_bias
from tests.attention.test_linear import D_K, D_V, H, check_against_reference, inputs, rel_err, sized
from tests.helpers.paths import CONF
from tvq_exp.attention import build_attention
from tvq_exp.attention.base import repeat_kv
from tvq_exp.attention.dense import DenseAttention
from tvq_exp.attention.dense.naive import dense_attention as dense_reference
from tvq_exp.attention.dense.naive import softmax_attention
from tvq_exp.attention.flash_chunk.naive import flash_chunk_attention as flash_chunk_reference
from tvq_exp.attention.linear.naive import linear_attention as linear_reference
from tvq_exp.attention.vq.naive import vq_attention as vq_window_reference
from tvq_exp.models.blocks import GAUBlock, MHABlock

CORPUS = Path("/work/shared/datasets/text/tinyshakespeare.txt")


# ---------------------------------------------------------------- talking heads
def test_identity_talking_heads_equal_plain_multi_head_attention() -> None:
    q, k, v = inputs(torch.float64, kv_heads=2)
    for score in ("softmax", "relu2"):
        plain = sized("dense", kv_heads=2, score=score).double()
        talking = sized(
            "dense", kv_heads=2, score=score, talking_heads=True, talking_heads_post=True
        ).double()
        assert torch.equal(talking.mix_pre, torch.eye(H, dtype=torch.float64))
        assert rel_err(talking(q, k, v)[0], plain(q, k, v)[0]) < 1e-12
    assert rel_err(plain(q, k, v)[0], dense_reference(plain, q, k, v)) < 1e-12


def test_identity_talking_heads_block_equals_plain_block() -> None:
    torch.manual_seed(0)
    plain = MHABlock(
        d_model=24,
        attention=functools.partial(build_attention, name="dense", window_len=8),
        heads=4,
        position="xl",
    ).double()
    talking = MHABlock(
        d_model=24,
        attention=functools.partial(build_attention, name="dense", window_len=8, talking_heads=True),
        heads=4,
        position="xl",
    ).double()
    talking.load_state_dict(plain.state_dict(), strict=False)
    x = torch.randn(2, 11, 24, dtype=torch.float64)
    assert rel_err(talking(x)[0], plain(x)[0]) < 1e-12


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("post", [False, True])
def test_talking_heads_equal_reference(dtype: torch.dtype, post: bool) -> None:
    attn = sized(
        "dense",
        kv_heads=2,
        talking_heads=True,
        talking_heads_post=post,
        window_bias=True,
        window_len=5,
    )
    with torch.no_grad():
        for mix in (attn.mix_pre, attn.mix_post):
            if mix is not None:
                mix.copy_(torch.randn(H, H, generator=torch.Generator().manual_seed(3)) * 0.6)
    check_against_reference(with_random_bias(attn), dense_reference, dtype, kv_heads=2)


WITHOUT_TALKING_HEADS = [name for name in NAMES if not backend_class(name).supports_talking_heads]


@pytest.mark.parametrize("name", WITHOUT_TALKING_HEADS)
@pytest.mark.parametrize("flag", ["talking_heads", "talking_heads_post"])
def test_talking_heads_refused_by_other_backends(name: str, flag: str) -> None:
    with pytest.raises(ValueError, match=f"{flag}.*{name}.*dense"):
        build(name, d_k=D_K, d_v=D_V, heads=H, **{flag: True})
    attn = build(name, d_k=D_K, d_v=D_V, heads=H, **{flag: False})
    assert not isinstance(attn, DenseAttention)


@pytest.mark.parametrize("backend", WITHOUT_TALKING_HEADS)
def test_talking_heads_refused_when_the_config_is_composed(backend: str) -> None:
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        cfg = compose(
            overrides=[
                "+model=mha_talking_heads",
                "+data.vocab_size=256",
                "+block_len=16",
                "+codebook_size=32",
                "+codebook=ema",
                f"model/attention={backend}",
            ]
        )
    with pytest.raises(InstantiationException, match="talking_heads"):
        instantiate(cfg.model)


# ---------------------------------------------------------------- key_size / kv_heads
def test_key_size_sets_the_parameter_shapes() -> None:
    attn = functools.partial(build_attention, name="dense", window_len=8)
    blk = MHABlock(d_model=32, attention=attn, heads=4, head_size=10, key_size=6, kv_heads=2, position="xl")
    assert blk.w_q.weight.shape == (4 * 6, 32)
    assert blk.w_kv.weight.shape == (2 * (6 + 10), 32)
    assert blk.w_o.weight.shape == (32, 4 * 10)
    assert (blk.attn.d_k, blk.attn.d_v, blk.attn.kv_heads) == (6, 10, 2)
    assert blk.attn.bias.u.shape == (4, 6)
    default = MHABlock(d_model=32, attention=attn, heads=4, position="xl")
    assert default.w_q.weight.shape == (32, 32) and default.w_kv.weight.shape == (2 * 32, 32)
    out, _, _ = blk(torch.randn(2, 7, 32))
    assert out.shape == (2, 7, 32)


GROUPED = {
    "dense": ({"window_bias": True, "window_len": 4}, dense_reference),
    "vq": ({"codebook_size": 8, "block_len": 5, "window_bias": True, "window_len": 4}, vq_window_reference),
    "linear": ({"feature_map": "favor", "chunk_size": 4}, linear_reference),
    "flash_chunk": ({"group_size": 5, "window_bias": True, "window_len": 3}, flash_chunk_reference),
}


@pytest.mark.parametrize("name", sorted(GROUPED))
@pytest.mark.parametrize("kv_heads", [1, 2])
def test_grouped_kv_heads_for_every_backend(name: str, kv_heads: int) -> None:
    options, reference = GROUPED[name]
    torch.manual_seed(0)
    attn = build(name, d_k=D_K, d_v=D_V, heads=H, kv_heads=kv_heads, **options).eval()
    check_against_reference(
        with_random_bias(attn) if getattr(attn, "bias", None) is not None else attn,
        reference,
        torch.float64,
        kv_heads,
    )


@pytest.mark.parametrize("name", ["dense", "linear", "flash_chunk"])
def test_grouped_kv_equals_repeated_kv(name: str) -> None:
    options = {key: value for key, value in GROUPED[name][0].items() if not key.startswith("window")}
    grouped = build(name, d_k=D_K, d_v=D_V, heads=H, kv_heads=1, **options).double()
    full = copy.deepcopy(grouped)
    full.kv_heads = H
    q, k, v = inputs(torch.float64, kv_heads=1)
    assert rel_err(grouped(q, k, v)[0], full(q, repeat_kv(k, H), repeat_kv(v, H))[0]) < 1e-12


def test_mqa_softmax_equals_plain_reference() -> None:
    attn = sized("dense", kv_heads=1).double()
    q, k, v = inputs(torch.float64, kv_heads=1)
    assert rel_err(attn(q, k, v)[0], softmax_attention(q, k, v)) < 1e-12


# ---------------------------------------------------------------- causality by Jacobian
# every backend of the shared table (XL positions where its class takes the bias, else RoPE), and variants
BACKENDS = {
    **{
        name: (
            "xl" if backend_class(name).supports_position_bias else "rope",
            {"name": name, **small_options(name, length=4, codes=8, position_bias=False)},
        )
        for name in NAMES
    },
    "flash_quad": ("xl", {"name": "dense", "window_len": 4, "score": "relu2"}),
    "talking_heads": ("rope", {"name": "dense", "talking_heads": True, "talking_heads_post": True}),
    "favor": ("none", {"name": "linear", "feature_map": "favor", "chunk_size": 5}),
    "flash_chunk_window": ("xl", {"name": "flash_chunk", "group_size": 4, "window_len": 3}),
}


def build_block(kind: str, backend: str) -> torch.nn.Module:
    position, options = BACKENDS[backend]
    attn = functools.partial(build_attention, **options)
    torch.manual_seed(0)
    if kind == "gau":
        return GAUBlock(d_model=16, attention=attn, d_k=6, heads=2, position=position).double().eval()
    return (
        MHABlock(d_model=16, attention=attn, heads=4, key_size=6, kv_heads=2, position=position)
        .double()
        .eval()
    )


def input_dependence(blk: torch.nn.Module, length: int) -> torch.Tensor:
    """``(T_out, T_in)``: row ``t`` of the Jacobian of the fp64 block ``blk`` (width 16) on ``length`` random
    inputs, projected on a random output direction, ``|d out_t / d x_s|`` summed over the input's width."""
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(1, length, 16, dtype=torch.float64, generator=gen, requires_grad=True)
    out = blk(x)[0][0]
    rows = []
    for t in range(out.shape[0]):
        (grad,) = torch.autograd.grad(
            out[t], x, torch.randn(out[t].shape, generator=gen, dtype=torch.float64), retain_graph=True
        )
        rows.append(grad[0].abs().sum(-1))
    return torch.stack(rows)


@pytest.mark.parametrize("kind", ["gau", "mha"])
@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_causality_by_jacobian(kind: str, backend: str) -> None:
    dep = input_dependence(build_block(kind, backend), 13)
    assert dep.triu(1).max() == 0, "an output depends on a later input"
    assert (dep.tril(-1) > 0).any(), "the Jacobian is all zero below the diagonal"
    assert (dep.diagonal() > 0).all()


# ---------------------------------------------------------------- presets
PRESETS = {
    "gau_linear": ["model.block.d_k=32", "model.attention.chunk_size=16"],
    "gau_flash": ["model.block.d_k=32", "model.attention.group_size=16"],
    "gau_flash_quad": ["model.block.d_k=32", "model.attention.window_len=32"],
    "mha_linear": ["model.attention.chunk_size=16"],
    "mha_flash": ["model.attention.group_size=16"],
    "mha_talking_heads": ["model.attention.window_len=32"],
    "mha_mqa": ["model.attention.window_len=32"],
}


@functools.cache
def corpus() -> torch.Tensor:
    """The shared corpus as raw bytes ``(N,)``."""
    return torch.frombuffer(bytearray(CORPUS.read_bytes()), dtype=torch.uint8)


def corpus_windows(batch: int, length: int, generator: torch.Generator) -> torch.Tensor:
    """Random windows of ``length + 1`` bytes: ``(batch, length + 1)`` token ids."""
    data = corpus()
    start = torch.randint(0, data.numel() - length - 1, (batch,), generator=generator)
    return torch.stack([data[s : s + length + 1] for s in start.tolist()]).long()


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_preset_composes_and_trains(preset: str) -> None:
    overrides = [
        f"+model={preset}",
        "+codebook=ema",
        "+data.vocab_size=256",
        "model.d_model=64",
        "model.n_layers=2",
        *PRESETS[preset],
    ]
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        cfg = compose(overrides=overrides)
    torch.manual_seed(0)
    model = instantiate(cfg.model)
    gen = torch.Generator().manual_seed(0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(10):
        batch = corpus_windows(8, 64, gen)
        out = model(batch[:, :-1])
        loss = F.cross_entropy(out.logits.reshape(-1, 256), batch[:, 1:].reshape(-1)) + out.aux["loss"]
        opt.zero_grad()
        loss.backward()
        opt.step()
        model.codebook_step()
        losses.append(loss.item())
    assert sum(losses[-3:]) / 3 < losses[0] - 0.3, losses


# ---------------------------------------------------------------- GAU key_norm
def gau_pair(backend: dict, norm: str) -> GAUBlock:
    torch.manual_seed(0)
    attn = functools.partial(build_attention, **backend)
    return GAUBlock(d_model=16, attention=attn, d_k=8, heads=2, position="xl", key_norm=norm).double().eval()


def test_unit_keys_are_the_rms_keys_on_the_unit_sphere() -> None:
    """``key_norm="unit"``: the attention sees ``hW_k/||hW_k||``, the official keys divided by ``d_k^1/4``."""
    seen: dict[str, torch.Tensor] = {}
    blocks = {norm: gau_pair({"name": "dense", "window_len": 4}, norm) for norm in ("rms", "unit")}
    for norm, blk in blocks.items():
        blk.attn.register_forward_hook(lambda m, args, out, norm=norm: seen.__setitem__(norm, args[1]))
        blk(torch.randn(2, 9, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1)))
    assert torch.allclose(seen["unit"].norm(dim=-1), torch.ones(()).double())
    assert torch.allclose(seen["unit"] * 8**0.25, seen["rms"], atol=1e-5)


def test_unit_keys_are_the_cosine_codebooks_keys() -> None:
    """VQ with ``codebook.normalize=true`` quantises the same keys whichever ``key_norm``: equal outputs."""
    vq = {"name": "vq", "codebook_size": 8, "block_len": 4, "codebook": {"normalize": True}}
    x = torch.randn(2, 12, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    rms, unit = (gau_pair(vq, norm)(x)[0] for norm in ("rms", "unit"))
    assert torch.allclose(rms, unit, atol=1e-12)
    plain = gau_pair({"name": "vq", "codebook_size": 8, "block_len": 4}, "unit")(x)[0]
    assert (plain - unit).abs().max() > 1e-3  # the codes differ without normalize: the test can fail


def test_key_norm_refused_when_the_config_is_composed() -> None:
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        cfg = compose(
            overrides=["+model=gau_dense", "+data.vocab_size=256", "+block_len=8", "+model.block.key_norm=l2"]
        )
    with pytest.raises(InstantiationException, match="key_norm.*'l2'.*rms, unit"):
        instantiate(cfg.model)


def test_the_gau_takes_its_silus_after_splitting_values_from_gate(monkeypatch: pytest.MonkeyPatch) -> None:
    """The values the GAU hands its attention are SiLU's output of their own half of ``hW_vg``, not a view of one
    output shared with the gate: compiled, each half's SiLU then fuses with its readers forward and with its
    gradient's writers backward (one SiLU over the whole projection made the backward join the halves' gradients
    into a buffer before SiLU's gradient: 22 MiB a sequence of the paper GAU's compiled step,
    ``docs/step_analysis/2026-11-29/paper_block_compiled.py``). The same numbers either way."""
    torch.manual_seed(0)
    block = GAUBlock(
        d_model=16, attention=functools.partial(build_attention, "dense"), d_k=8, heads=2, position="rope"
    )
    handed = []
    attend = block.attend
    monkeypatch.setattr(block, "attend", lambda q, k, v, state: handed.append(v) or attend(q, k, v, state))
    x = torch.randn(2, 12, 16)
    block(x)
    (v,) = handed
    assert v.untyped_storage().nbytes() == v.numel() * v.element_size()  # its own buffer, no gate in it
    want = F.silu(block.w_vg(block.norm(x))).chunk(2, dim=-1)[0]
    assert torch.equal(v.transpose(1, 2).reshape(2, 12, -1), want)
