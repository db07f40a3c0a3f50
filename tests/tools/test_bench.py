"""The benchmark CLI on tiny configurations (the FLOP formulas it reports: tests/models/test_flops.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hydra.utils import instantiate

from tvq_exp import bench
from tvq_exp.attention.registry import build_attention
from tvq_exp.tools.bench import driver
from tvq_exp.tools.bench.cases import compose_model
from tvq_exp.tools.bench.driver import MODEL_SETTINGS, model_settings

FIELDS = {
    "backend",
    "seq_len",
    "mode",
    "ms",
    "tokens_per_s",
    "peak_mem_mb",
    "gflops",
    "gflops_per_s",
    "mm_fraction",
}
TINY = ["--reps", "1", "--budget", "0", "--threads", "1"]


def test_attention_bench_writes_documented_records(tmp_path: Path) -> None:
    out = tmp_path / "attn.json"
    argv = [
        "attention",
        "--backends",
        "vq",
        "--lengths",
        "64",
        "--mode",
        "fwdbwd",
        "--mm-size",
        "64",
    ]
    bench.main([*argv, *TINY, "--json", str(out)])
    records = json.loads(out.read_text())
    assert len(records) == 1 and all(
        FIELDS <= rec.keys() for rec in records
    )  # (unknown backends are refused)
    (vq,) = records
    assert vq["backend"] == "vq" and vq["seq_len"] == 64 and vq["mode"] == "fwdbwd"
    assert vq["ms"] > 0 and vq["peak_mem_mb"] >= 0  # measured: only their signs are known
    # the FLOPs are the backend's count at the benchmark's settings (no XL bias unless asked), forward + backward
    attn = build_attention(
        "vq", d_k=128, d_v=256, heads=1, codebook_size=512, block_len=512, window_len=512
    )  # ATTENTION_SETTINGS
    assert vq["gflops"] * 1e9 == attn.flops(64, 1, backward=True)
    seconds = vq["ms"] / 1e3
    assert vq["tokens_per_s"] == pytest.approx(64 / seconds, rel=1e-9)
    assert vq["gflops_per_s"] == pytest.approx(vq["gflops"] / seconds, rel=1e-9)
    assert vq["mm_fraction"] == pytest.approx(vq["gflops_per_s"] / vq["mm_gflops_per_s"], rel=1e-9)


def test_model_bench_writes_records_and_plot(tmp_path: Path) -> None:
    out, png = tmp_path / "model.json", tmp_path / "model.png"
    argv = [
        "model",
        "--models",
        "gau_vq",
        "--lengths",
        "64",
        "--mm-size",
        "64",
        *TINY,
        "--json",
        str(out),
        "--plot",
        str(png),
    ]
    bench.main(argv)
    records = json.loads(out.read_text())
    assert [r["backend"] for r in records] == ["gau_vq"]
    assert all(FIELDS <= rec.keys() for rec in records)
    assert records[0]["tokens_per_s"] > 0 and records[0]["peak_mem_mb"] >= 0
    model = instantiate(compose_model("gau_vq", MODEL_SETTINGS).model)
    assert records[0]["gflops"] * 1e9 == pytest.approx(model.flops(64, 1, backward=True), rel=1e-12)
    assert records[0]["mm_fraction"] > 0
    assert png.stat().st_size > 0


def test_model_preset_is_composed_at_bench_width() -> None:
    cfg = compose_model("gau_vq", MODEL_SETTINGS)
    assert cfg.model.d_model == 256 and cfg.model.n_layers == 4
    assert cfg.model.attention.codebook_size == 512 and cfg.model.attention.block_len == 512
    assert cfg.model.attention.codebook.init == "random"  # the official codebook unless one is named
    healthy = compose_model("gau_vq@healthy", MODEL_SETTINGS).model.attention.codebook
    assert (healthy.init, healthy.reseed_fraction, healthy.decay_warmup) == ("kmeans", 0.1, 200)
    sampled = compose_model("gau_vq@sampled", MODEL_SETTINGS).model.attention.codebook
    assert (sampled.assignment, sampled.temperature_anneal) == ("sampled", 75000)  # 3/4 of the schedule


def test_model_bench_width_depth_and_per_model_overrides(tmp_path: Path) -> None:
    """``--d-model``, ``--n-layers`` and ``--set MODEL:KEY=VALUE`` shape the measured model (e.g. the
    dense GAU without its XL bias, so it runs scaled_dot_product_attention)."""
    args = bench.parser().parse_args(
        ["model", "--models", "gau_dense,gau_vq", "--d-model", "32", "--n-layers", "1"]
        + ["--set", "gau_dense:block.position=none", "--set", "block.d_k=8"]
    )
    dense, vq = (model_settings(args, name) for name in ("gau_dense", "gau_vq"))
    assert dense["overrides"] == ["block.position=none", "block.d_k=8"] and vq["overrides"] == ["block.d_k=8"]
    cfg = compose_model("gau_dense", dense)
    assert (cfg.model.d_model, cfg.model.n_layers) == (32, 1)
    assert cfg.model.block.position == "none" and cfg.model.block.d_k == 8
    assert compose_model("gau_vq", vq).model.block.position == "xl"
    out = tmp_path / "m.json"
    bench.main(
        ["model", "--models", "gau_dense", "--lengths", "32", "--mm-size", "64", *TINY, "--json", str(out)]
        + ["--d-model", "32", "--n-layers", "1", "--set", "gau_dense:block.position=none"]
    )
    (rec,) = json.loads(out.read_text())
    assert rec["overrides"] == ["block.position=none"] and rec["d_model"] == 32 and rec["ms"] > 0


def test_model_bench_sets_options_the_preset_does_not_state() -> None:
    """Presets do not restate constructor defaults, so ``--set MODEL:+KEY=VALUE`` adds a key (``block.key_smear``)."""
    args = bench.parser().parse_args(["model", "--models", "gau_vq", "--set", "gau_vq:+block.key_smear=true"])
    assert compose_model("gau_vq", model_settings(args, "gau_vq")).model.block.key_smear is True


def test_model_bench_sets_a_field_of_the_codebook_group() -> None:
    """``--set MODEL:codebook.KEY=VALUE`` reaches the VQ layer's codebook (``attention.codebook`` reads the group)."""
    args = bench.parser().parse_args(
        ["model", "--models", "gau_vq", "--set", "gau_vq:attention.cache_keys=mean",
         "--set", "gau_vq:codebook.hard_warmup=7"]
    )  # fmt: skip
    assert compose_model("gau_vq", model_settings(args, "gau_vq")).model.attention.codebook.hard_warmup == 7


def test_model_bench_refuses_a_malformed_override() -> None:
    with pytest.raises(SystemExit):
        bench.parser().parse_args(["model", "--set", "gau_dense:block.position"])


def test_a_configuration_that_does_not_fit_is_reported_and_the_sweep_goes_on(tmp_path: Path) -> None:
    """Dense attention needs ~T² memory: under a 64 MiB cap T=4096 fails to allocate, is recorded as
    out of memory, and the next (smaller) configuration is still measured."""
    out = tmp_path / "attn.json"
    argv = ["attention", "--backends", "dense", "--lengths", "4096,256", "--mode", "fwd", "--mm-size", "64"]
    bench.main([*argv, *TINY, "--mem-limit-mb", "64", "--json", str(out)])
    big, small = json.loads(out.read_text())
    assert big["error"].startswith("out of memory") and big["ms"] is None
    assert small["ms"] > 0 and "error" not in small


def test_model_bench_times_inference_and_training_and_records_the_kernel(tmp_path: Path) -> None:
    """``--mode fwd`` times an inference forward (its FLOPs without the backward), ``train`` a training step;
    every record says which attention kernel ran; ``gau_dense_flex`` is the dense preset through flex attention."""
    out = tmp_path / "m.json"
    bench.main(
        ["model", "--models", "gau_dense", "--mode", "train,fwd", "--lengths", "32", "--mm-size", "64", *TINY]
        + ["--d-model", "32", "--n-layers", "1", "--json", str(out)]
    )
    train, fwd = json.loads(out.read_text())
    assert (train["mode"], fwd["mode"]) == ("train", "fwd") and train["kernel"] == fwd["kernel"] == "plain"
    model = instantiate(compose_model("gau_dense", model_settings(bench.parser().parse_args(
        ["model", "--d-model", "32", "--n-layers", "1"]), "gau_dense")).model)  # fmt: skip
    assert fwd["gflops"] * 1e9 == pytest.approx(model.flops(32, 1, backward=False), rel=1e-12)
    assert train["gflops"] * 1e9 == pytest.approx(model.flops(32, 1, backward=True), rel=1e-12)
    assert compose_model("gau_dense_flex", MODEL_SETTINGS).model.attention.kernel == "flex"
    assert compose_model("gau_dense", MODEL_SETTINGS).model.attention.kernel == "plain"
    assert compose_model("gau_vq_flex", MODEL_SETTINGS).model.attention.kernel == "flex"
    with pytest.raises(SystemExit, match="fwdbwd"):
        bench.main(["model", "--mode", "fwdbwd"])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["attention", "--lengths", "0"], "--lengths: must be comma-separated positive integers, got '0'"),
        (["attention", "--lengths", "64,-5"], "--lengths: must be comma-separated positive integers"),
        (["model", "--lengths", "abc"], "--lengths: must be comma-separated positive integers, got 'abc'"),
        (
            ["attention", "--backends", "dense,nope"],
            "error: --backends=dense,nope: unknown nope; choose from",
        ),
        (["model", "--models", "no_such_preset"], "error: --models=no_such_preset: unknown no_such_preset"),
        (["model", "--models", "gau_vq@nope"], "error: --models=gau_vq@nope: unknown gau_vq@nope"),
        (["attention", "--mode", "train"], "error: --mode=train: must be fwd and/or fwdbwd"),
    ],
)
def test_bad_arguments_are_refused_before_anything_runs(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out.json"
    with pytest.raises(SystemExit) as exit_info:
        bench.main([*argv, "--json", str(out)])
    assert exit_info.value.code not in (0, None)
    assert message in f"{exit_info.value.code}{capsys.readouterr().err}"
    assert not out.exists()


def test_bench_creates_its_folders_and_keeps_each_record_as_it_finishes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The README's bench command on a fresh clone (no bench/): the folders are created, and a record is in the
    JSON once measured, so a run killed at the second length keeps the first."""
    out, png = tmp_path / "bench" / "attn.json", tmp_path / "figures" / "attn.png"
    argv = ["attention", "--backends", "dense", "--mode", "fwd", "--mm-size", "64", *TINY]
    bench.main([*argv, "--lengths", "32,64", "--json", str(out), "--plot", str(png)])
    assert [rec["seq_len"] for rec in json.loads(out.read_text())] == [32, 64] and png.stat().st_size > 0
    # a relative path names the file from the working folder (not its folder twice)
    monkeypatch.chdir(tmp_path)
    bench.main([*argv, "--lengths", "32", "--json", "rel/bench/attn.json"])
    written = [p.relative_to(tmp_path).as_posix() for p in (tmp_path / "rel").rglob("*.json")]
    assert written == ["rel/bench/attn.json"]

    measured = driver.measure

    def killed_at_64(spec: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        if spec.get("seq_len") == 64:  # the torch.mm reference has no length
            raise KeyboardInterrupt
        return measured(spec, timeout_s)

    monkeypatch.setattr(driver, "measure", killed_at_64)
    fresh = tmp_path / "again" / "attn.json"
    with pytest.raises(KeyboardInterrupt):
        bench.main([*argv, "--lengths", "32,64", "--json", str(fresh)])
    (first,) = json.loads(fresh.read_text())
    assert first["seq_len"] == 32 and first["ms"] > 0 and FIELDS <= first.keys()


def test_the_number_of_timed_calls_comes_from_a_call_after_the_warm_up() -> None:
    """A first call that compiles (slow) must not leave a single timed call: the count comes from the first timed
    call, so a kernel whose first call takes most of the budget is still timed ``reps`` times, all warm."""
    import time

    import torch

    from tvq_exp.measure.timing import time_calls

    calls = []

    def fn() -> None:
        time.sleep(0.3 if not calls else 0.001)
        calls.append(1)

    times = time_calls(fn, torch.device("cpu"), reps=5, budget_s=0.5)
    # five warm calls of ~1 ms, none of them the 300 ms first call
    assert len(times) == 5 and max(times) < 100

    def slow() -> None:
        time.sleep(0.05)

    assert len(time_calls(slow, torch.device("cpu"), reps=5, budget_s=0.1)) == 2  # the budget caps the count
