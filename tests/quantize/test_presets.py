"""Every preset of ``codebook`` composes, validates and keeps the VQ attention invariants:
VQ attention equals dense softmax over the quantised keys (forward and gradients), streaming in segments and
token-by-token decoding equal one forward, and it is causal. Each preset first trains a few steps (k-means
init, EMA updates, re-seeding), so the codebook it is checked with is one its rules produced."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from tests.attention.backends import build
from tests.helpers.paths import CONF
from tests.helpers.vq_reference import assert_equals_reference as replayed_reference
from tvq_exp.attention.vq import VQAttention
from tvq_exp.run.validation import validate

PRESETS = sorted(p.stem for p in Path(CONF, "codebook").glob("*.yaml"))
# options that compose with a preset, as docs/codebooks.md recommends them (point 7: healthy on the unit sphere)
COMBINATIONS = {"healthy+normalize": ("healthy", "codebook.normalize=true")}
CASES = PRESETS + sorted(COMBINATIONS)
T, L = 14, 3


@functools.cache
def preset(name: str) -> dict[str, Any]:
    """The codebook options of ``codebook=<name>``, or of a combination of :data:`COMBINATIONS` (composed and
    validated)."""
    base, *extra = COMBINATIONS.get(name, (name,))
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=["experiment=smoke", "model=gau_vq", f"codebook={base}", *extra])
    validate(cfg)
    return OmegaConf.to_container(cfg.model.attention.codebook)


def test_presets_are_the_official_settings_plus_their_remedy() -> None:
    assert {
        "ema",
        "gradient",
        "ema_warmup",
        "ema_kmeans",
        "ema_reseed",
        "cosine",
        "simvq",
        "rotation",
        "healthy",
        "sampled",
    } <= set(PRESETS)
    official = preset("ema")
    assert (official["update"], official["decay"], official["estimator"], official["init"]) == (
        "ema",
        0.99,
        "straight_through",
        "random",
    )
    assert official["reseed_fraction"] == 0 and official["decay_warmup"] == 0 and not official["normalize"]
    changed = {name: {k for k, v in preset(name).items() if official[k] != v} for name in PRESETS}
    assert changed["ema_reseed"] == {"reseed_fraction"} and changed["cosine"] == {"normalize"}
    assert changed["rotation"] == {"estimator"} and changed["simvq"] == {"update"}
    assert changed["healthy"] == {"decay_warmup", "init", "reseed_fraction"}
    assert changed["sampled"] == changed["healthy"] | {"assignment", "temperature_anneal"}
    assert preset("healthy+normalize") == preset("healthy") | {"normalize": True}
    assert official["assignment"] == "nearest"


def trained(name: str) -> VQAttention:
    """A small fp64 VQ attention with the preset's codebook after three training steps, in eval mode."""
    torch.manual_seed(0)
    options = preset(name) | {"sample_keys": 64}
    attn = build(
        "vq",
        d_k=4,
        d_v=3,
        heads=2,
        codebook_size=6,
        block_len=L,
        window_len=2,
        codebook=options,
        window_bias=True,
    ).double()
    torch.nn.init.normal_(attn.bias.u)
    torch.nn.init.normal_(attn.bias.v)
    attn.train()
    for step in range(3):
        g = torch.Generator().manual_seed(100 + step)
        q, k, v = (torch.randn(2, 2, T, d, generator=g, dtype=torch.float64) for d in (4, 4, 3))
        attn(q, k, v)
        attn.quantizer.update()
    return attn.eval()


def qkv(grad: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return tuple(
        torch.randn(2, 2, T, d, generator=g, dtype=torch.float64).requires_grad_(grad) for d in (4, 4, 3)
    )


def assert_equals_reference(attn: VQAttention, seed: int | None = None) -> None:
    """The VQ attention's output and input gradients equal the dense reference over its quantised keys; with
    ``seed``, both draw their codes after seeding torch's generator with it (the same draw)."""
    grads = replayed_reference(attn, *qkv(), seed=seed)[2]
    assert grads[1].abs().sum() > 0


@pytest.mark.parametrize("name", CASES)
def test_vq_equals_dense_softmax_over_quantised_keys(name: str) -> None:
    assert_equals_reference(trained(name))


@pytest.mark.parametrize(
    ("overrides", "anneal"),
    [
        (["experiment=recall_cpu"], 1500),
        (["experiment=longctx_cpu"], 450),
        (["trainer.max_steps=1001"], 751),
        (["trainer.max_steps=10", "module.max_steps=1001"], 751),  # the schedule's length, not the stop
    ],
)
def test_sampled_anneals_over_three_quarters_of_the_run(overrides: list[str], anneal: int) -> None:
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=[*overrides, "model=gau_vq", "codebook=sampled"])
    validate(cfg)
    assert cfg.model.attention.codebook.temperature_anneal == anneal


def test_drawn_codes_in_training_keep_vq_equal_to_dense_softmax_over_the_quantised_keys() -> None:
    """In training ``sampled`` draws the codes; the VQ kernel (window and cache) must use the drawn codes, as the
    reference does on the same draw (the same seed)."""
    attn = trained("sampled").train()
    assert_equals_reference(attn, seed=11)
    k = qkv(grad=False)[1]
    torch.manual_seed(11)
    drawn = attn.quantizer(k)[1]
    assert not torch.equal(drawn, attn.eval().quantizer(k)[1])  # the draw is not the nearest code


@pytest.mark.parametrize("name", CASES)
def test_streaming_decoding_and_causality(name: str) -> None:
    attn = trained(name)
    q, k, v = qkv(grad=False)
    full, _, _ = attn(q, k, v)
    for cuts in ([5, 9], list(range(1, T))):  # segments, then token by token
        pieces, state = [], None
        for a, b in zip([0, *cuts], [*cuts, T], strict=True):
            o, state, _ = attn(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], state)
            pieces.append(o)
        assert torch.allclose(torch.cat(pieces, 2), full, atol=1e-12)
    x = torch.cat([q, k, v], -1)[:1]
    jac = torch.autograd.functional.jacobian(lambda y: attn(y[..., :4], y[..., 4:8], y[..., 8:])[0], x)
    per_pos = jac.abs().sum(dim=(0, 1, 3, 4, 5, 7))
    assert torch.all(per_pos.triu(1) == 0) and torch.all(per_pos.diagonal() > 0)


CPU_PRESETS = ("smoke", "cpu_small", "longctx_cpu", "recall_cpu", "passkey_cpu", "quickstart", "repeat_cpu")
PAPER_PRESETS = ("enwik8_paper", "pg19_paper", "imagenet64_paper")


@pytest.mark.parametrize("experiment", CPU_PRESETS + PAPER_PRESETS)
def test_cpu_presets_use_the_healthy_codebook_and_paper_presets_the_official_one(experiment: str) -> None:
    """The codebook study's choice for the CPU presets (docs/codebooks.md), the official settings for the paper's;
    and a CPU preset still composes with another backend (the codebook group is top-level)."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=[f"experiment={experiment}"])
        dense = compose("train", overrides=[f"experiment={experiment}", "model=gau_dense"])
    expected = preset("healthy") if experiment in CPU_PRESETS else preset("ema")
    assert OmegaConf.to_container(cfg.model.attention.codebook) == expected
    assert dense.model.attention.name == "dense" and "codebook" not in dense.model.attention
