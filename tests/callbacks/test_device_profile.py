"""``debug=device_profile``: a torch.profiler window over optimiser steps ``skip .. skip + steps - 1``, written per
step (self device time, its share, calls) to ``device-profile.json`` and as torch's table."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from torch.autograd import DeviceType
from torch.utils.data import DataLoader

from tests.helpers.paths import REPO
from tests.models.test_flops import tiny_preset
from tvq_exp.callbacks.device_profile import DeviceProfile
from tvq_exp.measure.profile import (
    OUR_KERNELS,
    compile_summary,
    host_summary,
    kernel_kind,
    profile_calls,
    profile_summary,
)
from tvq_exp.models.module import AutoregressiveLitModule


def _fit(tmp_path: Path, steps: int, profiler: DeviceProfile) -> None:
    torch.manual_seed(0)
    model = tiny_preset("tiny")
    tokens = torch.randint(0, model.vocab_size, (steps * 4, 33))
    trainer = L.Trainer(
        max_steps=steps, accelerator="cpu", precision="32-true", logger=False, callbacks=[profiler],
        limit_val_batches=0, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    data = [{"input": row[:-1], "target": row[1:]} for row in tokens]
    trainer.fit(AutoregressiveLitModule(model, lr=1e-3, max_steps=steps), DataLoader(data, batch_size=4))


def test_the_window_is_written_per_step(tmp_path: Path) -> None:
    torch._dynamo.utils.counters.clear()
    _fit(tmp_path, 7, DeviceProfile(str(tmp_path), skip=2, steps=3, rows=500))
    profile = json.loads((tmp_path / "device-profile.json").read_text())
    # an eager step: nothing compiled
    assert profile["compile"] == {
        "graphs": 0,
        "frames": 0,
        "graph_breaks": 0,
        "break_reasons": {},
        "resumes": {},
    }
    assert profile["device"] == "cpu" and profile["steps"] == 3
    rows = profile["rows"]
    times = [r["ms_per_step"] for r in rows]
    assert times == sorted(times, reverse=True) and times[-1] > 0
    assert sum(r["share"] for r in rows) == pytest.approx(1.0)  # every op kept (rows=500)
    assert sum(times) == pytest.approx(profile["ms_per_step"])
    steps = [r for r in rows if r["name"].startswith("Optimizer.step#")]
    assert [r["calls_per_step"] for r in steps] == [1.0]  # one optimiser step per profiled step
    assert any(r["name"] in ("aten::mm", "aten::addmm", "aten::bmm") for r in rows)
    assert "Self CPU" in (tmp_path / "device-profile.txt").read_text()
    assert profile["calls_per_step"] == pytest.approx(sum(r["calls_per_step"] for r in rows))
    # the ops' self time on one thread fits in the window's wall clock
    assert 0 < profile["ms_per_step"] <= profile["wall_ms_per_step"]
    assert profile["busy_share"] == pytest.approx(profile["ms_per_step"] / profile["wall_ms_per_step"])
    assert sum(profile["by_kind"].values()) == pytest.approx(profile["ms_per_step"])
    assert profile["by_kind"]["gemm"] > 0
    # on a CPU the host's ops are the ops themselves
    host = profile["host"]
    assert host["rows"] == rows and host["ms_per_step"] == pytest.approx(profile["ms_per_step"])


def test_the_compile_summary_names_the_breaks_and_where_the_frames_resume() -> None:
    """A function compiled with one graph break (a ``print``), called for two values of an int it specialises on:
    two frames compiled with a break each, their graphs, the break's reason and the function resumed after it."""

    def step(x: torch.Tensor, n: int) -> torch.Tensor:
        y = x * n
        print("between", end="\r")  # noqa: T201 - the graph break under test
        return y + 1

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(step, backend="eager", dynamic=False)
    for n in (2, 2, 3):
        compiled(torch.ones(2), n)
    summary = compile_summary()
    assert summary["graph_breaks"] == 2 and summary["frames"] >= 3 and summary["graphs"] >= 3
    ((reason, count),) = summary["break_reasons"].items()
    assert count == 2 and "print" in reason and "Developer debug context" in reason
    assert summary["resumes"] == {
        "torch_dynamo_resume_in_step_at_" + str(step.__code__.co_firstlineno + 2): 2
    }  # the print's line
    torch._dynamo.reset()


def test_on_a_gpu_each_kernel_counts_once() -> None:
    """A host op's self device time is the time of the kernels it launched: on a GPU only the device's events
    count (an H200 profile counted both, 600 ms per step where the step took 458), and of those not the ranges of
    ``record_function`` the profiler copies onto the device (inductor wraps each compiled graph's call in one)."""

    def event(
        name: str, device: DeviceType, us: float, count: int, annotation: bool = False
    ) -> SimpleNamespace:
        return SimpleNamespace(
            key=name,
            device_type=device,
            self_device_time_total=us,
            count=count,
            is_user_annotation=annotation,
        )

    averages = [
        event("tvq::window_cache_forward", DeviceType.CPU, 8000.0, 2),
        # the profiler's copy of a record_function range on the device's timeline: the span of its kernels
        event("## Call CompiledFxGraph fabc ##", DeviceType.CUDA, 8500.0, 2, annotation=True),
        event("forward_kernel", DeviceType.CUDA, 8000.0, 2),
        event("aten::mm", DeviceType.CPU, 2000.0, 4),
        event("nvjet_gemm", DeviceType.CUDA, 2000.0, 4),
        event("Memcpy DtoD", DeviceType.CUDA, 500.0, 2),
    ]
    summary = profile_summary(averages, "self_device_time_total", steps=2, rows=10, device_events=True)
    assert summary["ms_per_step"] == pytest.approx(5.25)  # (8 + 2 + 0.5) ms over 2 steps
    # the host's side: its own ops by their self CPU time, none of the device's events
    for e, cpu_us in zip(averages, (900.0, 0.0, 0.0, 300.0, 0.0, 0.0), strict=True):
        e.self_cpu_time_total = cpu_us
    host = host_summary(averages, steps=2, rows=10)
    assert [(r["name"], r["ms_per_step"]) for r in host["rows"]] == [
        ("tvq::window_cache_forward", pytest.approx(0.45)),
        ("aten::mm", pytest.approx(0.15)),
    ]
    assert host["ms_per_step"] == pytest.approx(0.6) and host["calls_per_step"] == pytest.approx(3.0)
    assert [r["name"] for r in summary["rows"]] == ["forward_kernel", "nvjet_gemm", "Memcpy DtoD"]
    assert summary["calls_per_step"] == pytest.approx(4.0)
    assert sum(r["share"] for r in summary["rows"]) == pytest.approx(1.0)
    assert summary["by_kind"] == pytest.approx({"fused_vq": 4.0, "gemm": 1.0, "copies": 0.25})


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "gemm"),
        ("nvjet_tst_192x192_64x4_2x1_v_bz_coopB_TNT", "gemm"),
        ("cutlass3x_sm90_tensorop_gemm_bf16_bf16_f32", "gemm"),
        ("triton_tem_fused_mm_0", "gemm"),  # inductor's GEMM template
        ("aten::bmm", "gemm"),  # a CPU profile's rows are ops
        ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128>>", "attention"),
        ("fmha_cutlassF_bf16_aligned_64x128_rf_sm80", "attention"),  # memory-efficient: CUTLASS, not a GEMM
        ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop", "attention"),
        ("forward_kernel", "fused_vq"),
        ("prefix_backward_kernel", "fused_vq"),
        ("nearest_kernel", "fused_vq"),
        ("tvq::window_cache_forward", "fused_vq"),
        ("triton_red_fused__softmax_add_3", "inductor"),
        ("triton_poi_fused_mul_silu_7", "inductor"),
        ("Memcpy DtoD (Device -> Device)", "copies"),
        ("Memset (Device)", "copies"),
        ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>", "other"),
    ],
)
def test_each_row_has_a_kind_by_its_name(name: str, kind: str) -> None:
    assert kernel_kind(name) == kind


def test_our_kernels_are_the_triton_functions_the_repository_defines() -> None:
    """The names :func:`kernel_kind` takes for this repository's kernels are the names of its jitted functions (a
    renamed kernel would otherwise be counted as ``other``)."""
    sources = "".join(p.read_text() for p in Path("tvq_exp").rglob("*.py"))
    assert all(f"def {name}(" in sources for name in OUR_KERNELS)


def test_profiled_calls_are_summed_per_call_against_their_wall_clock() -> None:
    """What the GPU check and the tile search record of one case: each op per call, and how busy the calls kept
    the device (the CPU's ops here)."""
    x = torch.randn(256, 256)
    summary = profile_calls(lambda: torch.relu(x @ x), torch.device("cpu"), calls=3, rows=50)
    assert summary["steps"] == 3
    per_call = {r["name"]: r["calls_per_step"] for r in summary["rows"]}
    assert per_call["aten::mm"] == 1.0 and per_call["aten::relu"] == 1.0
    assert {r["name"]: r["calls_per_step"] for r in summary["host"]["rows"]} == per_call
    assert 0 < summary["ms_per_step"] <= summary["wall_ms_per_step"]
    assert summary["busy_share"] == pytest.approx(summary["ms_per_step"] / summary["wall_ms_per_step"])


def test_a_run_ending_inside_the_window_writes_what_it_profiled(tmp_path: Path) -> None:
    _fit(tmp_path, 4, DeviceProfile(str(tmp_path), skip=2, steps=5))
    assert json.loads((tmp_path / "device-profile.json").read_text())["steps"] == 2


def test_no_window_before_the_skip(tmp_path: Path) -> None:
    _fit(tmp_path, 3, DeviceProfile(str(tmp_path), skip=5, steps=2))
    assert not (tmp_path / "device-profile.json").exists()


def test_every_triton_kernel_of_the_repository_is_counted_as_ours() -> None:
    """Each ``@triton.jit`` function named ``*_kernel`` under ``tvq_exp/`` (the profiler's name for its launches)
    is a ``fused_vq`` row: a kernel added without its name counted as ``other`` (the cache means' block sums and
    code rows did, on an H200, 2026-11-29)."""
    pattern = re.compile(r"@triton\.jit\s*\ndef (\w+_kernel)\(")
    names = {name for path in (REPO / "tvq_exp").rglob("*.py") for name in pattern.findall(path.read_text())}
    assert "block_sums_kernel" in names and len(names) >= 9
    assert {name: kernel_kind(name) for name in names} == dict.fromkeys(names, "fused_vq")
