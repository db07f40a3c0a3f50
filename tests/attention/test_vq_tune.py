"""The fused kernel's block-size search (:mod:`tvq_exp.attention.vq.fused.tune`) on CPU under Triton's interpreter:
a check of the tool (its comparison, its choice), not a measurement."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from tvq_exp.attention.vq.fused import tune
from tvq_exp.attention.vq.fused.config import Tiles, tiles


@pytest.fixture(autouse=True)
def interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def test_every_tiling_computes_what_the_shipped_one_does_and_the_report_holds_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # one other tiling of the forward kernel and of the query-gradient kernel; the shipped tiles first
    monkeypatch.setitem(tune.CANDIDATES, "forward", ((32, 16, 4, 2),))
    monkeypatch.setitem(tune.CANDIDATES, "dq", ((16, 32, 4, 1),))
    out = tmp_path / "tune.json"
    argv = ["--device", "cpu", "--seq-len", "64", "--lengths", "64", "--head-dim", "16", "--tokens", "256",
            "--reps", "1", "--kernels", "forward,dq", "--out", str(out)]  # fmt: skip
    assert tune.main(argv) == 0
    report = json.loads(out.read_text())
    tiles_run = [r for r in report["records"] if r["section"] == "tiles"]
    # the shipped GPU tiles come first, for the case's blocks of 64 keys and 64 codes (dq's wide key tiles)
    forward, dq = (tiles(kernel, 16, 16, block=64, codes=64) for kernel in ("forward", "dq"))
    assert [(r["kernel"], r["bm"], r["bn"], r["tma"]) for r in tiles_run] == [
        ("forward", forward.bm, forward.bn, False), ("forward", 32, 16, False),
        ("dq", dq.bm, dq.bn, False), ("dq", 16, 32, False),
    ]  # fmt: skip
    # fp32 under the interpreter: a tiling only reorders sums (the shipped one compared with itself: exactly;
    # an alias of .grad, accumulated by the later calls, would show here as an error of order 1)
    assert all(r["rel_err"] <= 1e-5 for r in tiles_run), tiles_run
    assert {r["mode"] for r in tiles_run if r["kernel"] == "dq"} == {"fwdbwd"}
    assert set(report["best"]) == {"forward", "dq"}
    lengths = [r for r in report["records"] if r["section"] == "lengths"]
    assert [(r["tiles"], r["mode"]) for r in lengths] == [
        ("shipped", "fwd"), ("tuned", "fwd"), ("shipped", "fwdbwd"), ("tuned", "fwdbwd")
    ]  # fmt: skip
    assert set(report["profile"]) == {"fwd", "fwdbwd"} and report["device_ms"]["fwdbwd"] > 0


@pytest.mark.parametrize("kernel", ["forward", "dq"])
def test_the_search_times_the_tiles_through_descriptors_against_the_same_tiles_by_pointers(
    kernel: str,
) -> None:
    """At the check's heads (d 128, blocks and codebook of 512) the shipped forward and dq load through tensor
    descriptors: the search's second candidate is the same tiles by pointers, its third the same tiles with a third
    stage (before the budget may stop the search); the other shapes load as the op would load them (through
    descriptors only at the wide key tiles)."""
    shipped, *others = tune.candidates(kernel, 128, 128, 512)
    assert shipped == tiles(kernel, 128, 128, block=512, codes=512) and shipped.tma
    assert others[0] == Tiles(
        shipped.bm, shipped.bn, shipped.bdv, shipped.num_warps, shipped.num_stages, tma=False
    )
    assert others[1] == dataclasses.replace(shipped, num_stages=3)
    assert all(t.tma == (t.bn == shipped.bn) for t in others[1:])
    assert len(set(others)) == len(others) and shipped not in others


@pytest.mark.parametrize(("kernel", "rows", "before"), [("window_key", 32, 16), ("code", 64, 32)])
def test_the_search_times_the_gradients_rows_shipped_before_right_after_the_shipped_ones(
    kernel: str, rows: int, before: int
) -> None:
    """The keys' and codes' gradients step more rows since the nineteenth session (32 and 64, were 16 and 32): the
    search times the rows shipped before right after the shipped ones, before the budget may stop it."""
    shipped, *others = tune.candidates(kernel, 128, 128, 512)
    assert shipped == tiles(kernel, 128, 128, block=512, codes=512) and shipped.bm == rows
    assert others[0] == dataclasses.replace(shipped, bm=before)


def test_the_choice_is_the_fastest_kernel_within_tolerance() -> None:
    def rec(bm: int, ms: float, kernel_ms: float | None, err: float) -> dict:
        return {"section": "tiles", "kernel": "dq", "bm": bm, "bn": 64, "bdv": 128, "num_warps": 8,
                "num_stages": 1, "ms": ms, "kernel_ms": kernel_ms, "rel_err": err}  # fmt: skip

    # the kernel's own time decides, not the layer's; a wrong result is never chosen
    records = [rec(64, 10.0, 3.0, 0.0), rec(128, 9.0, 3.5, 0.0), rec(32, 8.0, 1.0, 0.5)]
    assert tune.best_tiles(records) == {"dq": Tiles(64, 64, 128, 8, 1)}
    # without a profile (a CPU), the layer's time
    records = [rec(64, 10.0, None, 0.0), rec(128, 9.0, None, 0.0)]
    assert tune.best_tiles(records) == {"dq": Tiles(128, 64, 128, 8, 1)}
    # timed, then failed: its results (no error measured) or its profile
    unchecked = {k: v for k, v in rec(32, 1.0, None, 0.0).items() if k != "rel_err"} | {
        "error": "RuntimeError"
    }
    unprofiled = rec(16, 1.0, None, 0.0) | {"error": "RuntimeError"}
    assert tune.best_tiles([*records, unchecked, unprofiled]) == {"dq": Tiles(128, 64, 128, 8, 1)}


def test_the_search_leaves_the_shipped_tiles_in_place() -> None:
    shipped = tune.op.tiles
    with tune.using({"forward": Tiles(16, 16, 16)}):
        assert tune.op.tiles("forward", 16, 16) == Tiles(16, 16, 16)
        assert tune.op.tiles("dq", 16, 16) == shipped("dq", 16, 16)
    assert tune.op.tiles is shipped


def test_the_search_leaves_the_comparison_of_lengths_its_share_of_the_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a clock that moves 100 s per candidate timed: with a 150 s budget, the search's 60% share stops it after
    # one candidate, and the comparison of lengths still runs (a search that took the whole budget left it none)
    clock = [0.0]
    record = tune.tile_record

    def slow_record(*args: object) -> dict:
        clock[0] += 100.0
        return record(*args)

    monkeypatch.setattr(tune, "tile_record", slow_record)
    monkeypatch.setattr(tune, "monotonic", lambda: clock[0])
    monkeypatch.setitem(tune.CANDIDATES, "forward", ((32, 16, 4, 2),))
    out = tmp_path / "tune.json"
    argv = ["--device", "cpu", "--seq-len", "32", "--lengths", "32", "--head-dim", "16", "--tokens", "128",
            "--reps", "1", "--kernels", "forward", "--budget", "150", "--out", str(out)]  # fmt: skip
    assert tune.main(argv) == 0
    records = json.loads(out.read_text())["records"]
    assert [r.get("error") for r in records if r["section"] == "tiles"] == [None, "skipped: budget"]
    lengths = [r for r in records if r["section"] == "lengths"]
    assert len(lengths) == 4 and all("ms" in r for r in lengths), lengths


def test_the_search_takes_the_cache_means_block_sums_tiles(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The block sums of the cache's means (``block_sums``) are searched first: the shipped GPU tiles, then the
    candidates, each computing what the shipped one does, timed forward; the op's kernels keep their tiles. A
    candidate the kernel cannot take (24 codes: not a power of 2) is recorded with its error: the tiles reach it."""
    monkeypatch.setattr(tune, "SUMS_CANDIDATES", ((32, 16, 16, 4, 1), (24, 16, 16, 4, 1)))
    kernel_tiles = tune.prefix.kernel_tiles
    out = tmp_path / "tune.json"
    argv = ["--device", "cpu", "--seq-len", "64", "--lengths", "64", "--block", "16", "--head-dim", "16", "--tokens", "256",
            "--reps", "1", "--kernels", "block_sums", "--out", str(out)]  # fmt: skip
    assert tune.main(argv) == 0
    assert tune.prefix.kernel_tiles is kernel_tiles  # put back
    report = json.loads(out.read_text())
    run = [r for r in report["records"] if r["section"] == "tiles"]
    assert "error" in run.pop() and all("error" not in r for r in run)
    shipped = tune.prefix.GPU_TILES["sums"]
    assert [(r["kernel"], r["bm"], r["bn"], r["bdv"], r["num_warps"], r["num_stages"], r["mode"]) for r in run] == [
        ("block_sums", *shipped, "fwd"), ("block_sums", 32, 16, 16, 4, 1, "fwd")
    ]  # fmt: skip
    assert all(r["rel_err"] <= 1e-5 for r in run), run
    assert report["best"]["block_sums"]["bm"] in (shipped[0], 32)
    with tune.using({"block_sums": tune.Tiles(32, 16, 16, 4, 1)}):
        assert tune.prefix.kernel_tiles(True, "sums") == (32, 16, 16, 4, 1)
        assert tune.prefix.kernel_tiles(True, "forward") == kernel_tiles(True, "forward")
