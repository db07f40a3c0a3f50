"""``make bench-gpu``: skips in one line without a GPU; its sections in order under budgets that fit 8 minutes, the
JSON written after each, a failed section recorded while the rest run; the attention and training sections run at
CPU size through their real worker processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from tests.helpers.paths import REPO
from tvq_exp.tools.bench.gpu import (
    BUDGETS,
    FIRST_TESTS,
    batch_sizes,
    cuda_test_files,
    device_info,
    jobs,
    parser,
    run_sections,
    training_shape,
    write_report,
)
from tvq_exp.tools.bench.gpu import (
    tests_section as run_tests_section,
)
from tvq_exp.tools.bench.gpu_attention import Case, attention_section, error_text, plan
from tvq_exp.tools.bench.gpu_training import training_section

needs_data = pytest.mark.needs_data("text/gutenberg")


def test_without_a_gpu_it_skips_in_one_line_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "gpu.json"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(
        [sys.executable, "-m", "tvq_exp.tools.bench.gpu", "--out", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0 and done.stdout.splitlines() == [
        "bench-gpu: skipped, no CUDA device here (torch.cuda.is_available() is False)"
    ]
    assert not out.exists()


@needs_data
def test_the_training_section_at_cpu_size_into_the_json_file(tmp_path: Path) -> None:
    shape = ["experiment=smoke", "trainer.check_val_every_n_epoch=null", "trainer.val_check_interval=1000000", "trainer.max_steps=1000000",
             "trainer.log_every_n_steps=2", "logger=csv", "trainer.enable_progress_bar=false", "torch_threads=1",
             "debug=device_profile", "callbacks.device_profile.skip=1", "callbacks.device_profile.steps=2"]  # fmt: skip
    training = training_section(shape, seconds=8, batch_sizes=[8], budget_s=120)
    path = write_report(tmp_path / "bench" / "gpu.json", {"training": training})

    written = json.loads(path.read_text())
    train = written["training"]
    assert train["batch_size"] == 8 and train["tried"] == [] and train["last_step"] > 2
    assert train["tokens_per_s"] > 0 and train["peak_mem_mb"] > 0
    profile = train["profile"]  # where the step's time goes: steps 1 and 2
    assert profile["device"] == "cpu" and profile["steps"] == 2 and profile["rows"][0]["ms_per_step"] > 0
    assert not (tmp_path / "bench" / "gpu.json.part").exists()


def test_a_training_run_stopped_at_the_budget_still_gives_the_rows_it_flushed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the compiled paper-size step on an H100 ran past its budget: the process is killed, its flushed rows stay
    def stopped(args: list[str], timeout: float) -> None:
        log_dir = next(a.split("=", 1)[1] for a in args if a.startswith("paths.log_dir="))
        csv_dir = Path(log_dir) / "runs" / "bench_gpu" / "csv"
        csv_dir.mkdir(parents=True)
        rows = ["step,throughput/tokens_per_s,throughput/peak_mem_mb"]
        rows += [f"{10 * i},{1000 * i},{500 + i}" for i in range(1, 5)]
        (csv_dir / "metrics.csv").write_text("\n".join(rows) + "\n")
        raise subprocess.TimeoutExpired("train.py", timeout, stderr=b"compiling\nstep 40")

    monkeypatch.setattr("tvq_exp.tools.bench.gpu_training.run_train", stopped)
    train = training_section(["experiment=smoke"], seconds=8, batch_sizes=[8, 4], budget_s=60)
    assert train["batch_size"] == 8 and train["stopped"].startswith("stopped at the section's 60 s")
    assert train["tokens_per_s"] == 3500 and train["peak_mem_mb"] == 504 and train["last_step"] == 40

    # nothing flushed: the stop is recorded with what the run was printing, and no smaller batch is tried
    def silent(args: list[str], timeout: float) -> None:
        raise subprocess.TimeoutExpired("train.py", timeout, stderr=b"compiling\nstill compiling")

    monkeypatch.setattr("tvq_exp.tools.bench.gpu_training.run_train", silent)
    train = training_section(["experiment=smoke"], seconds=8, batch_sizes=[8, 4], budget_s=60)
    assert train["error"] == "no batch size fitted"
    assert train["tried"] == [{"batch_size": 8, "error": "stopped at the section's 60 s budget",
                               "log_tail": ["compiling", "still compiling"]}]  # fmt: skip


def test_a_run_cut_short_keeps_the_sections_that_finished(tmp_path: Path) -> None:
    # a device call's time limit kills the check mid-way: what finished before is already in the file
    def cut(save: object) -> dict[str, str]:
        assert json.loads(path.read_text())["attention"]["records"] == [1]
        raise KeyboardInterrupt  # as the limit's kill would stop it

    path = tmp_path / "gpu.json"
    with pytest.raises(KeyboardInterrupt):
        run_sections(
            path,
            {"device": {"name": "gpu"}},
            [("attention", lambda save: {"records": [1]}), ("training", cut)],
        )
    written = json.loads(path.read_text())
    assert list(written) == ["device", "attention"] and written["attention"]["records"] == [1]


def test_the_sections_run_in_order_within_an_eight_minute_call() -> None:
    assert [name for name, _ in jobs(parser().parse_args([]))] == ["attention", "training", "tests"]
    assert [name for name, _ in jobs(parser().parse_args(["--skip", "training"]))] == ["attention", "tests"]
    assert sum(BUDGETS.values()) + 30 <= 8 * 60  # 30 s: the interpreter, CUDA and the device report


def test_the_training_kernel_is_auto_unless_named_and_an_unknown_one_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert training_shape(parser().parse_args([]))[-2:] == ("model.attention.kernel=auto", "data=gutenberg")
    named = training_shape(parser().parse_args(["--train-kernel", "triton", "--data", "kjv"]))
    assert named[-2:] == ("model.attention.kernel=triton", "data=kjv")
    assert sum(x.startswith("model.attention.kernel=") for x in named) == 1
    with pytest.raises(SystemExit):
        parser().parse_args(["--train-kernel", "fused"])
    assert "invalid choice: 'fused'" in capsys.readouterr().err


def test_more_training_overrides_come_last_and_compose_into_a_valid_run() -> None:
    """``--train-overrides``: Hydra overrides after the shape (so they win), composing into a configuration the run
    accepts: the step launched by the host, timed next to the preset's CUDA graphs."""
    from tests.helpers.config import compose_config
    from tvq_exp.run.validation import validate

    preset = compose_config("train", training_shape(parser().parse_args([])))
    assert preset.module.compile_mode == "reduce-overhead"
    extra = "module.compile_mode=default data.batch_size=4"
    shape = training_shape(parser().parse_args(["--train-overrides", extra]))
    assert shape[-2:] == ("module.compile_mode=default", "data.batch_size=4")
    cfg = compose_config("train", shape)
    validate(cfg)
    assert cfg.module.compile_mode == "default" and cfg.module.compile_scope == "blocks"


PROBE = """
import time

import pytest


def test_ok_cuda():
    pass


def test_bad_cuda():
    assert False


@pytest.mark.skip(reason="no device")
def test_skipped_cuda():
    pass


@pytest.mark.parametrize("case", ["a b", "c"])
def test_param_cuda(case):
    assert case != "c"


def test_not_selected():
    assert False
"""


def test_the_tests_section_counts_each_outcome_and_names_the_tests_that_failed(tmp_path: Path) -> None:
    probe = tmp_path / "test_probe.py"
    probe.write_text(PROBE)
    done = run_tests_section(120, paths=[str(probe)])
    counts = {key: done[key] for key in ("tests", "passed", "failed", "errors", "skipped")}
    assert counts == {"tests": 5, "passed": 2, "failed": 2, "errors": 0, "skipped": 1}
    assert [t.split("::")[-1] for t in done["not_passed"]] == ["test_bad_cuda", "test_param_cuda[c]"]
    assert done["returncode"] == 1 and done["error"].startswith("pytest exited 1: ")
    assert {t.split("::")[-1]: r for t, r in done["reasons"].items()} == {
        "test_bad_cuda": "call: assert False",
        "test_param_cuda[c]": "call: AssertionError: assert 'c' != 'c'",
    }


def test_the_tests_section_stopped_at_its_budget_keeps_why_the_finished_tests_failed(tmp_path: Path) -> None:
    """On the H200 of 2026-11-30 the section stopped at its budget with two CUDA tests failed and nothing of why:
    pytest prints its failures' report at the end of the run. Each reason is written as it happens."""
    probe = tmp_path / "test_probe.py"
    probe.write_text(
        "import time\n\n\ndef test_bad_cuda():\n    raise ValueError('the kernel\\nmissed')\n\n\n"
        "@__import__('pytest').fixture\ndef broken():\n    raise KeyError('no device')\n\n\n"
        "def test_setup_cuda(broken):\n    pass\n\n\ndef test_slow_cuda():\n    time.sleep(120)\n"
    )
    done = run_tests_section(25, paths=[str(probe)])
    assert done["error"] == "stopped at its 25 s budget"
    assert {t.split("::")[-1]: r for t, r in done["reasons"].items()} == {
        "test_bad_cuda": "call: ValueError: the kernel missed",
        "test_setup_cuda": "setup: KeyError: 'no device'",
    }


def test_the_tests_section_stopped_at_its_budget_keeps_what_finished(tmp_path: Path) -> None:
    probe = tmp_path / "test_probe.py"
    probe.write_text(
        PROBE.replace("def test_bad_cuda():\n    assert False", "def test_slow_cuda():\n    time.sleep(120)")
    )
    done = run_tests_section(25, paths=[str(probe)])
    assert done["error"] == done["summary"] == "stopped at its 25 s budget"
    assert (done["tests"], done["passed"], done["not_passed"], done["returncode"]) == (1, 1, [], None)


def test_the_tests_section_runs_the_kernels_tests_first_then_every_other_file_that_mentions_cuda(
    tmp_path: Path,
) -> None:
    """On the H200 of 2026-11-28 the section ran out of its budget over the whole suite in name order, before the
    fused kernels' device tests: those come first now, then the rest, each file once."""
    files = cuda_test_files()
    assert files[: len(FIRST_TESTS)] == list(FIRST_TESTS) and len(set(files)) == len(files)
    for first in FIRST_TESTS:
        assert "cuda" in (REPO / first).read_text()
    (tmp_path / "tests" / "deep").mkdir(parents=True)
    (tmp_path / "tests" / "deep" / "test_b.py").write_text("def test_b_cuda(): pass\n")
    (tmp_path / "tests" / "test_a.py").write_text("def test_a_cuda(): pass\n")
    (tmp_path / "tests" / "test_c.py").write_text("def test_c(): pass\n")
    assert cuda_test_files(tmp_path) == [*FIRST_TESTS, "tests/deep/test_b.py", "tests/test_a.py"]


def test_the_tests_section_leaves_out_the_tests_that_train_a_model_first(tmp_path: Path) -> None:
    """A documented command's test and the command-line fuzz train a model in a subprocess before their CUDA case:
    not the kernels' check, and minutes of its budget."""
    for name in ("test_doc_commands", "test_fuzz_cli", "test_kernel"):
        (tmp_path / f"{name}.py").write_text("def test_case_cuda(): pass\n")
    done = run_tests_section(120, paths=[str(p) for p in sorted(tmp_path.glob("test_*.py"))])
    assert (done["tests"], done["passed"]) == (1, 1)


def test_a_failed_section_is_recorded_the_rest_run_and_the_check_fails(tmp_path: Path) -> None:
    path, seen = tmp_path / "gpu.json", []

    def attention(save: object) -> dict[str, object]:
        raise RuntimeError("CUDA error: an illegal memory access")

    def training(save: object) -> dict[str, object]:
        seen.append(json.loads(path.read_text()))  # the failed section is already in the file
        return {"tokens_per_s": 1.0}

    ok = run_sections(path, {}, [("attention", attention), ("training", training)])
    written = json.loads(path.read_text())
    assert not ok and seen[0]["attention"]["error"] == "RuntimeError: CUDA error: an illegal memory access"
    assert written["training"]["tokens_per_s"] == 1.0 and "seconds" in written["training"]
    assert run_sections(tmp_path / "ok.json", {}, [("tests", lambda save: {"tests": 3})])


def test_the_attention_section_at_cpu_size_saves_after_each_case_in_their_order(tmp_path: Path) -> None:
    saved: list[list[tuple[str, str]]] = []
    section = attention_section(
        90, lambda partial: saved.append([(r["kernel"], r["mode"]) for r in partial["records"]]),
        kernels=("vq_plain", "sdpa_flash", "sdpa_cudnn"), lengths=(256,), head_dim=16, tokens=512, device="cpu",
    )  # fmt: skip
    order = [(k, m) for k in ("vq_plain", "sdpa_flash", "sdpa_cudnn") for m in ("fwdbwd", "fwd")]
    assert saved == [order[: i + 1] for i in range(len(order))]  # one worker, the file after each case
    plain = [r for r in section["records"] if r["kernel"] == "vq_plain"]
    assert [(r["mode"], r["seq_len"], r["batch_heads"]) for r in plain] == [
        ("fwdbwd", 256, 4),
        ("fwd", 256, 4),
    ]
    assert all(r["ms"] > 0 and r["tflops_per_s"] > 0 and r["flash_time_ratio"] > 0 for r in plain)
    cudnn = section["records"][
        -2:
    ]  # a case that fails (no cuDNN kernel on a CPU): its error, and the next runs
    assert all(r["error"].startswith("RuntimeError: No viable backend") for r in cudnn)


def test_the_device_record_names_the_triton_that_compiled_the_kernels(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the lent GPUs' Triton (3.6) allocates registers otherwise than the venv's: a figure is read with its compiler
    import triton

    props = SimpleNamespace(name="NVIDIA H200", total_memory=141 * 2**30, major=9, minor=0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)
    info = device_info()
    assert (
        info["triton"] == triton.__version__ and info["name"] == "NVIDIA H200" and info["capability"] == "9.0"
    )


def test_the_cases_asked_for_are_profiled_too_after_their_times() -> None:
    # what explains a missed target: where one call's time went, by op (kernels on a GPU), against its wall clock
    section = attention_section(
        90, lambda partial: None, kernels=("vq_plain",), lengths=(256, 512), head_dim=16, tokens=1024,
        device="cpu", profiled=("vq_plain:512",),
    )  # fmt: skip
    profiled = {(r["seq_len"], r["mode"]): r.get("profile") for r in section["records"]}
    assert {case for case, profile in profiled.items() if profile} == {(512, "fwdbwd"), (512, "fwd")}
    for mode in ("fwdbwd", "fwd"):
        profile = profiled[(512, mode)]
        assert profile["steps"] == 1 and 0 < profile["ms_per_step"] <= profile["wall_ms_per_step"]
        assert any(r["name"] in ("aten::bmm", "aten::mm") for r in profile["rows"]), profile["rows"]


def test_the_cases_run_kernel_by_kernel_as_chosen_forward_and_backward_first() -> None:
    assert [str(c) for c in plan(("sdpa_flash", "vq_triton"), (8192, 32768))] == [
        "sdpa_flash:8192:fwdbwd", "sdpa_flash:32768:fwdbwd", "sdpa_flash:8192:fwd", "sdpa_flash:32768:fwd",
        "vq_triton:8192:fwdbwd", "vq_triton:32768:fwdbwd", "vq_triton:8192:fwd", "vq_triton:32768:fwd",
    ]  # fmt: skip
    assert Case.parse("vq_flex:8192:fwd") == Case("vq_flex", 8192, "fwd")
    with pytest.raises(ValueError, match="case 'vq_fast:8192:fwd': kernel one of"):
        Case.parse("vq_fast:8192:fwd")


def test_a_case_past_its_time_is_stopped_its_kernel_skipped_and_the_next_kernel_runs_in_a_new_worker() -> (
    None
):
    section = attention_section(
        120, lambda partial: None, kernels=("vq_flex", "sdpa_flash"), lengths=(256, 512), head_dim=16,
        tokens=1024, device="cpu", case_s=1,
    )  # fmt: skip
    records = section["records"]
    assert [(r["kernel"], r.get("error")) for r in records[:4]] == [
        ("vq_flex", "stopped after 1 s"),  # compiling flex takes seconds
        *[("vq_flex", "skipped: its 256 fwdbwd case was stopped after 1 s")] * 3,
    ]
    assert [r["kernel"] for r in records[4:]] == ["sdpa_flash"] * 4 and all(r["ms"] > 0 for r in records[4:])


def test_once_the_budget_is_spent_the_running_case_is_stopped_and_the_rest_skipped() -> None:
    section = attention_section(1, lambda partial: None, kernels=("vq_plain",), lengths=(256,), device="cpu")
    assert section["records"] == [
        {"kernel": "vq_plain", "seq_len": 256, "mode": "fwdbwd", "error": "stopped at the section's budget"},
        {"kernel": "vq_plain", "seq_len": 256, "mode": "fwd", "error": "skipped: budget"},
    ]


def test_a_worker_that_dies_costs_its_case_and_a_new_one_runs_the_rest() -> None:
    section = attention_section(
        120,
        lambda partial: None,
        kernels=("sdpa_flash",),
        lengths=(256,),
        head_dim=16,
        tokens=512,
        device="nope",
    )
    assert [r["mode"] for r in section["records"]] == ["fwdbwd", "fwd"]  # each case its own worker's death
    assert all(
        r["error"].startswith("the worker exited 1 in this case: RuntimeError: Expected one of")
        for r in section["records"]
    )


def test_the_attention_kernels_can_be_chosen_and_an_unknown_one_is_refused_in_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from tvq_exp.tools.bench.gpu import attention_kernels
    from tvq_exp.tools.bench.gpu_attention import KERNELS

    assert attention_kernels("sdpa_flash,vq_triton_compiled") == ["sdpa_flash", "vq_triton_compiled"]
    assert attention_kernels(",".join(KERNELS)) == list(KERNELS) and KERNELS[:4] == (
        "sdpa_flash",
        "vq_triton",
        "vq_triton_graphed",
        "vq_triton_compiled",
    )  # the targets' kernels first
    with pytest.raises(
        SystemExit, match=r"--kernels 'sdpa_flash,vq_fast': unknown \['vq_fast'\]; allowed: sdpa_flash,"
    ):
        attention_kernels("sdpa_flash,vq_fast")


def test_the_training_tries_the_papers_batch_of_16_first_on_a_device_that_holds_it() -> None:
    h200, h100 = 150_754_820_096, 85_045_821_440  # total_memory as torch reports them
    assert batch_sizes("auto", h200) == [16, 8, 4, 2]
    assert batch_sizes("auto", h100) == [8, 4, 2]
    assert batch_sizes("4,2", h200) == [4, 2]


def test_a_timed_call_sets_its_gradients_as_a_training_step_does() -> None:
    """The attention section's timed call (here VQ's plain kernel at CPU size) repeated: the second call runs the
    same ops as the first, no add into the previous call's gradients (which a training step, zeroing them to
    None first, never does)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from tvq_exp.tools.bench.gpu_attention import case

    class Ops(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.names: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
            self.names.append(str(func))
            return func(*args, **(kwargs or {}))

    call, _ = case("vq_plain", 1024, "fwdbwd", 16, torch.device("cpu"), tokens=4096)
    first, second = Ops(), Ops()
    with first:
        call()
    with second:
        call()
    assert sorted(second.names) == sorted(first.names)


def test_a_call_is_graphed_on_cuda_only_and_refused_elsewhere_in_one_line() -> None:
    from tvq_exp.tools.bench.gpu_attention import graphed

    calls: list[int] = []
    with pytest.raises(RuntimeError, match="^a CUDA graph needs a CUDA device, not 'cpu'$"):
        graphed(lambda: calls.append(1), torch.device("cpu"))
    assert calls == []  # refused before any call


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("mode", ["fwdbwd", "fwd"])
def test_the_graphed_cuda_case_replays_the_eager_calls_output_and_gradients(
    mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``vq_triton_graphed``'s replay computes what ``vq_triton``'s eager call does: the same output and, forward +
    backward, the same gradients in the leaves (the fused kernels are deterministic and the layer's codebook does not
    change between calls), replay after replay."""
    from tvq_exp.tools.bench import gpu_attention

    build, seen = gpu_attention.attention_layer, {}

    def spied(kernel: str, *args: object) -> torch.nn.Module:
        layer = build(kernel, *args)
        layer.register_forward_pre_hook(
            lambda module, inputs: seen.setdefault(kernel, {}).update(leaves=inputs)
        )
        layer.register_forward_hook(lambda module, inputs, out: seen[kernel].update(out=out[0]))
        return layer

    monkeypatch.setattr(gpu_attention, "attention_layer", spied)
    for kernel in ("vq_triton", "vq_triton_graphed"):
        torch.manual_seed(0)
        call, _ = gpu_attention.case(kernel, 2048, mode, 64, torch.device("cuda"), tokens=16384)
        for _ in range(3):
            call()
        torch.cuda.synchronize()
    eager, graphed = seen["vq_triton"], seen["vq_triton_graphed"]
    assert torch.equal(eager["out"], graphed["out"])  # the capture's output tensor, rewritten by each replay
    for a, b in zip(eager["leaves"], graphed["leaves"], strict=True):
        # the leaves (B, T, H, d) behind the layer's (B, H, T, d) views
        grads = [x._base.grad for x in (a, b)]
        assert (grads == [None, None]) if mode == "fwd" else torch.equal(*grads)


def test_a_failed_case_records_the_errors_it_was_raised_from() -> None:
    """On the H200 of 2026-11-30 the 8k CUDA-graph case kept only ``operation failed due to a previous error during
    capture``: the error that broke the capture, raised before it, was lost."""

    def capture() -> None:
        try:
            raise ValueError("operation not permitted when stream is capturing\nmore lines")
        except ValueError:
            raise RuntimeError("operation failed due to a previous error during capture")  # noqa: B904

    with pytest.raises(RuntimeError) as caught:
        capture()
    assert error_text(caught.value) == (
        "RuntimeError: operation failed due to a previous error during capture "
        "(after ValueError: operation not permitted when stream is capturing)"
    )
    assert error_text(KeyError("no device")) == "KeyError: 'no device'"
    try:
        raise RuntimeError("outer") from None
    except RuntimeError as err:  # an error raised ``from None`` names nothing before it
        assert error_text(err) == "RuntimeError: outer"


def test_the_plain_quantiser_case_is_vq_tritons_layer_with_the_quantisers_work_by_torchs_ops(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``vq_triton_plain_quantiser`` times ``vq_triton``'s layer but for the quantiser's fused pass, in the same call:
    the A/B the twenty-sixth session's two machines could not give."""
    from tvq_exp.tools.bench.gpu_attention import attention_layer

    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the fused kernels build on a CPU under the interpreter
    fused, plain = (
        attention_layer(k, 16, torch.device("cpu")) for k in ("vq_triton", "vq_triton_plain_quantiser")
    )
    assert fused.kernel == plain.kernel == "triton"
    assert fused.quantizer.fused_pass and not plain.quantizer.fused_pass
