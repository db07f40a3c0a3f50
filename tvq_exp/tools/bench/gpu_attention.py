"""The GPU check's attention section: :func:`attention_section` runs the cases of every kernel in one worker process
(``python -m tvq_exp.tools.bench.gpu_attention --cases ...``), most wanted first.

Over 300 lines: the section and its worker share one protocol (:class:`Case`, the ``READY`` and ``CASE`` lines, the
records); apart, each module would restate it.

Causal attention, bf16, head dim ``d`` (128: where SDPA's flash kernel runs), ``S = L = 512``, at each ``T`` with
``B·H·T`` fixed (512k tokens: ``B·H`` = 64 / 16 / 4 at T = 8k / 32k / 128k; ``H = 4``), forward + backward
(``fwdbwd``) and forward (``fwd``). Kernels (:data:`KERNELS`, in the order they run):

- ``sdpa_flash``, ``sdpa_cudnn``: ``F.scaled_dot_product_attention(is_causal=True)`` restricted to that SDPA
  backend (``torch.nn.attention.sdpa_kernel``); an error where torch has no such kernel for the shape;
- ``vq_triton``, ``vq_flex``, ``vq_plain``: :class:`~tvq_exp.attention.vq.VQAttention` with that ``kernel`` (keys
  quantised by the layer's own codebook, the cache on, no XL bias);
- ``vq_triton_graphed``: ``vq_triton``'s call (forward and backward, eager) captured once in a CUDA graph and
  replayed (:func:`graphed`): the same kernels on the same tensors, launched from the graph, none by the host. Its
  time over ``vq_triton``'s says how much of the eager call's wall clock is the host's launching, the question the
  profiles of 2026-11-30 left open (their device time below the wall clock);
- ``vq_triton_compiled``: ``vq_triton``'s layer under ``torch.compile`` (as ``module.compile`` runs it in training):
  the quantiser, the cache's running means and the layout around the fused kernels become inductor's kernels, the
  fused op (two custom ops, ``tvq::window_cache_forward`` / ``_backward``) is one node of the compiled graph;
- ``vq_triton_plain_quantiser``: ``vq_triton``'s layer with the quantiser's per-key work by torch's ops
  (``codebook.fused_pass=False``), timed in the same call as ``vq_triton`` (its fused pass): the twenty-sixth
  session's kernels for that work saved device time and lost wall clock, timed on two machines;
- ``dense_flex``: the dense backend's compiled flex-attention kernel (``kernel=flex``).

Each measurement prints one ``CASE {json}`` line as soon as it is done: ``ms`` (median of CUDA-synchronised calls
after a warm-up, which includes any compilation), ``flops`` and ``tflops_per_s``. FLOPs, useful work: dense causal
attention ``2·B·H·T²·d`` forward (half of the ``4·B·H·T²·d`` of the full square; FlashAttention's convention) and
3.5 times that with the backward; VQ its layer's :meth:`~tvq_exp.attention.vq.VQAttention.flops` (the same for
every kernel). A case that fails (no such kernel, out of memory) prints its error and the next runs.

The cases of :data:`PROFILED` (VQ's fused layer, eager and compiled, at 32k) are also profiled, one call after the
timed ones: ``profile`` holds where the call's device time went, each kernel once, and how busy the call kept the
device (:func:`~tvq_exp.measure.profile.profile_calls`): the profile that explains a missed target.
"""

from __future__ import annotations

import argparse
import importlib
import json
import queue
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any, NamedTuple

import torch
import torch.nn.functional as F

from tvq_exp.measure.profile import profile_calls
from tvq_exp.measure.timing import matmul_peak_flops, sync, time_calls

REPO = Path(__file__).resolve().parents[3]
# In the order they run, most wanted first: what the targets compare (SDPA flash, VQ's fused kernel eager and
# compiled), then the other baselines and VQ's other kernels. One H200 run of 2026-11-28 gave every kernel an equal
# share of 130 s in a process of its own: start-up and compilation took most of it, and VQ's fused kernel got
# forward + backward at 8k only.
KERNELS = (
    "sdpa_flash", "vq_triton", "vq_triton_graphed", "vq_triton_compiled", "vq_triton_plain_quantiser", "sdpa_cudnn",
    "dense_flex", "vq_plain", "vq_flex",
)  # fmt: skip
LENGTHS = (8192, 32768, 131072)
TOKENS = 512 * 1024  # B·H·T
HEADS = 4
MODES = ("fwdbwd", "fwd")  # forward + backward first: the targets' figure
# one case past this many seconds (compiling, hung) is stopped, and its kernel's remaining cases skipped
CASE_SECONDS = 90.0
CONTEXT_LOST = 3  # the worker's exit status after a CUDA error that leaves its device context unusable
MM_SIZE = 8192  # the ceiling: an 8192³ bf16 matmul
PROFILED = (
    "vq_triton:32768",
    "vq_triton_compiled:32768",
)  # KERNEL:T whose cases are profiled too, both modes
PROFILE_ROWS = 25  # the kernels a profile keeps, largest first


class Case(NamedTuple):
    """One measurement: a kernel at one length and mode."""

    kernel: str
    seq_len: int
    mode: str

    def failed(self, error: str) -> dict[str, Any]:
        """The record of this case where it gave no times."""
        return {**self._asdict(), "error": error}

    def __str__(self) -> str:
        return f"{self.kernel}:{self.seq_len}:{self.mode}"

    @classmethod
    def parse(cls, text: str) -> Case:
        kernel, seq_len, mode = text.split(":")
        if kernel not in KERNELS or mode not in MODES:
            raise ValueError(f"case {text!r}: kernel one of {KERNELS}, mode one of {MODES}")
        return cls(kernel, int(seq_len), mode)


def plan(kernels: Sequence[str], lengths: Sequence[int]) -> list[Case]:
    """The cases in the order they run: kernel by kernel as given, each at every length forward + backward, then
    forward."""
    return [Case(k, t, m) for k in kernels for m in MODES for t in lengths]


def dense_flops(batch_heads: int, seq_len: int, head_dim: int, backward: bool) -> int:
    """Useful FLOPs of causal dense attention (FlashAttention's convention): ``2·BH·T²·d`` forward, ×3.5 with
    the backward (its five matmuls against the forward's two)."""
    forward = 2 * batch_heads * seq_len**2 * head_dim
    return forward * 7 // 2 if backward else forward


def _sdpa(backend_name: str) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = {"sdpa_flash": SDPBackend.FLASH_ATTENTION, "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION}[
        backend_name
    ]

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    return attend


def attention_layer(kernel: str, head_dim: int, device: torch.device) -> Any:
    """The attention module one of :data:`KERNELS` (but SDPA's) runs, on ``device``."""
    from tvq_exp.attention import build_attention

    if kernel == "dense_flex":
        return build_attention("dense", d_k=head_dim, d_v=head_dim, heads=HEADS, kernel="flex").to(device)
    opts = {
        "codebook_size": 512,
        "block_len": 512,
        "kernel": kernel.removeprefix("vq_").split("_")[0],
        "codebook": {"fused_pass": not kernel.endswith("_plain_quantiser")},
    }
    return build_attention("vq", d_k=head_dim, d_v=head_dim, heads=HEADS, **opts).to(device)


def case(
    kernel: str, seq_len: int, mode: str, head_dim: int, device: torch.device, tokens: int = TOKENS
) -> tuple[Callable[[], None], int]:
    """The timed call of one configuration (``B = tokens / (H·T)``) and its useful FLOPs."""
    batch = max(1, tokens // (seq_len * HEADS))
    train = mode == "fwdbwd"
    # drawn on the device: on the host, one case's four 67M-element operands took 1.5 s to draw (the 2-core CI machine)
    gen = torch.Generator(device=device).manual_seed(0)
    # (B, T, H, d) transposed to (B, H, T, d): the layout a model's projections give (and cuDNN's kernel wants)
    shape = (batch, seq_len, HEADS, head_dim)

    def draw(scale: float) -> torch.Tensor:
        return (torch.randn(shape, generator=gen, device=device) * scale).to(torch.bfloat16)

    leaves = [draw(head_dim**-0.25).requires_grad_(train) for _ in range(3)]
    q, k, v = (x.transpose(1, 2) for x in leaves)
    grad = draw(1.0).transpose(1, 2) if train else None
    if kernel.startswith("sdpa"):
        attend, flops = _sdpa(kernel), dense_flops(batch * HEADS, seq_len, head_dim, train)
    else:
        layer = attention_layer(kernel, head_dim, device)
        if kernel.endswith("_compiled"):
            # each case compiles a new layer of the same class: without a reset the cases would fill dynamo's cache
            # of that code, and a case past its limit would run eager, unsaid
            torch._dynamo.reset()
            run = torch.compile(layer, dynamic=False)
        else:
            run = layer
        attend = lambda q, k, v: run(q, k, v)[0]  # noqa: E731
        flops = layer.flops(seq_len, batch, backward=train) if kernel.startswith("vq") else None
        flops = flops or dense_flops(batch * HEADS, seq_len, head_dim, train)

    graph = kernel.endswith("_graphed")

    def call() -> None:
        # a CUDA graph's capture takes autocast without its cache of cast weights (whose copies would outlive it)
        with (
            torch.set_grad_enabled(train),
            torch.autocast(device.type, torch.bfloat16, cache_enabled=not graph),
        ):
            out = attend(q, k, v)
        if grad is not None:
            # as a training step (``zero_grad(set_to_none=True)``): each call's gradients are set, not added to the
            # last call's (at 32k the adds into the three strided leaves took 0.7 ms of VQ's 9.9, H200 2026-11-29)
            for leaf in leaves:
                leaf.grad = None
            out.backward(grad)

    return (graphed(call, device) if graph else call), flops


def graphed(call: Callable[[], None], device: torch.device, warmups: int = 2) -> Callable[[], None]:
    """``call`` captured in one CUDA graph, returned as the graph's replay: ``warmups`` calls on a side stream first
    (the kernels compiled, the codebook initialised, the allocator's blocks made, as a capture needs), then one call
    captured. A replay runs the captured kernels on the same tensors (a training call's gradients land in the same
    ``.grad`` tensors each time); the host launches the graph, not its kernels."""
    if device.type != "cuda":
        raise RuntimeError(f"a CUDA graph needs a CUDA device, not {device.type!r}")
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(warmups):
            call()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    return graph.replay


def measure(
    kernel: str,
    seq_len: int,
    mode: str,
    head_dim: int,
    device: torch.device,
    reps: int,
    tokens: int = TOKENS,
    profiled: bool = False,
) -> dict[str, Any]:
    """One configuration: ``{ms, flops, tflops_per_s}`` (and ``profile`` where ``profiled``) or ``{error}``."""
    profile: dict[str, Any] | None = None
    try:
        call, flops = case(kernel, seq_len, mode, head_dim, device, tokens)
        times = time_calls(call, device, reps, budget_s=5.0)
        profile = _profile(call, device) if profiled else None
    except Exception as err:  # noqa: BLE001 - any failure of one case is recorded, the next case runs
        return {"error": error_text(err)}
    finally:
        if device.type == "cuda" and not context_lost(device):
            torch.cuda.empty_cache()
    ms = sorted(times)[len(times) // 2]
    result = {"ms": ms, "flops": flops, "tflops_per_s": flops / (ms / 1e3) / 1e12}
    return result if profile is None else result | {"profile": profile}


def error_text(err: BaseException, links: int = 3) -> str:
    """``Type: first line`` of ``err``, then of the errors it was raised from or during (up to ``links``): a CUDA
    graph's capture that failed says only ``operation failed due to a previous error during capture`` (the H200 of
    2026-11-30, at 8k), the error that broke it is the one before."""
    parts: list[str] = []
    while err is not None and len(parts) <= links:
        lines = str(err).strip().splitlines()
        parts.append(f"{type(err).__name__}: {lines[0][:200] if lines else ''}")
        err = err.__cause__ or (None if err.__suppress_context__ else err.__context__)
    return " (after ".join(parts) + ")" * (len(parts) - 1)


def _profile(call: Callable[[], None], device: torch.device) -> dict[str, Any]:
    """One more call, profiled; its error instead where the profiler fails (the case's times are kept)."""
    try:
        return profile_calls(call, device, rows=PROFILE_ROWS)
    except Exception as err:  # noqa: BLE001 - a profiler failure must not cost the case its times
        return {"error": error_text(err)}


def context_lost(device: torch.device) -> bool:
    """Whether ``device`` can no longer run anything in this process (a CUDA error such as an illegal address is
    sticky: every later call fails)."""
    if device.type != "cuda":
        return False
    try:
        torch.cuda.synchronize(device)
    except RuntimeError:
        return True
    return False


def record(c: Case, head_dim: int, tokens: int, **result: Any) -> dict[str, Any]:
    """A case's JSON record: what it ran, and ``result`` (its times, or its ``error``)."""
    return {"kernel": c.kernel, "seq_len": c.seq_len, "mode": c.mode, "head_dim": head_dim,
            "batch_heads": HEADS * max(1, tokens // (c.seq_len * HEADS)), **result}  # fmt: skip


def work(
    cases: Sequence[Case],
    head_dim: int,
    device: torch.device,
    reps: int,
    tokens: int = TOKENS,
    profiled: Sequence[str] = PROFILED,
) -> int:
    """The worker: ``READY`` once the device is up, then each case's ``CASE {json}`` line as it is done (the cases
    whose ``KERNEL:T`` is in ``profiled`` with their profile). Returns :data:`CONTEXT_LOST` after a case that left the
    device unusable (the parent runs the rest in a new worker)."""
    if device.type == "cuda":
        torch.cuda.init()
    # imported before the first case's time limit starts: the first backward imports torch's symbolic shapes (and
    # sympy), 0.9 s on a 2-core CI machine, which made a 1 s limit fail SDPA's first CPU case under load
    importlib.import_module("torch.fx.experimental.symbolic_shapes")

    print("READY", flush=True)
    for c in cases:
        profile = f"{c.kernel}:{c.seq_len}" in profiled
        result = measure(c.kernel, c.seq_len, c.mode, head_dim, device, reps, tokens, profile)
        print("CASE " + json.dumps(record(c, head_dim, tokens, **result)), flush=True)
        if "error" in result and context_lost(device):
            return CONTEXT_LOST
        sync(device)
    return 0


def attention_section(
    budget_s: float,
    save: Callable[[Any], None],
    kernels: Sequence[str] = KERNELS,
    lengths: Sequence[int] = LENGTHS,
    head_dim: int = 128,
    tokens: int = TOKENS,
    device: str = "cuda",
    case_s: float = CASE_SECONDS,
    profiled: Sequence[str] = PROFILED,
) -> dict[str, Any]:
    """Every case of :func:`plan` in one worker process within ``budget_s``; ``save`` gets the section after each
    case. A case past ``case_s`` (the worker's start-up not counted) is stopped and the rest of its kernel skipped;
    a worker that ends early (stopped, crashed, or its CUDA context lost) is followed by a new one for what is left;
    once the budget is spent the remaining cases are skipped. The cases whose ``KERNEL:T`` is in ``profiled`` are
    profiled too."""
    deadline = time.monotonic() + budget_s
    ceiling = (
        matmul_peak_flops(torch.device(device), torch.bfloat16, size=MM_SIZE) if device == "cuda" else None
    )
    section: dict[str, Any] = {"mm_size": MM_SIZE, "mm_tflops": None if ceiling is None else ceiling / 1e12,
                               "records": [], "budget_s": budget_s, "case_s": case_s}  # fmt: skip

    def add(done: dict[str, Any]) -> None:
        section["records"].append(done)
        save(_compared(section))

    pending = plan(kernels, lengths)
    options = ["--head-dim", str(head_dim), "--tokens", str(tokens), "--device", device,
               "--profiled", ",".join(profiled)]  # fmt: skip
    while pending and time.monotonic() < deadline:
        pending = _run_worker(pending, options, deadline, case_s, add)
    for c in pending:
        add(c.failed("skipped: budget"))
    return _compared(section)


def _run_worker(
    pending: list[Case], options: list[str], deadline: float, case_s: float, add: Callable[[dict], None]
) -> list[Case]:
    """Run ``pending`` in one worker until it finishes or stops; returns the cases it left."""
    pending = list(pending)
    command = [sys.executable, "-u", "-m", "tvq_exp.tools.bench.gpu_attention", "--cases",
               ",".join(map(str, pending)), *options]  # fmt: skip
    with tempfile.TemporaryFile("w+") as errors:
        worker = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=errors, text=True)
        lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=_pump, args=(worker.stdout, lines), daemon=True).start()
        started = None  # when the running case started (None: the worker is starting up)
        while pending:
            limit = deadline if started is None else min(deadline, started + case_s)
            try:
                line = lines.get(timeout=max(limit - time.monotonic(), 0.0))
            except queue.Empty:
                _end(worker, 0)
                return _stopped(pending, time.monotonic() >= deadline, case_s, add)
            if line is None:  # the worker ended
                status = _end(worker)
                if status != CONTEXT_LOST and pending:  # it died in a case (or before any)
                    errors.seek(0)
                    last = (errors.read().strip().splitlines() or ["?"])[-1][:200]
                    add(pending.pop(0).failed(f"the worker exited {status} in this case: {last}"))
                return pending
            if line == "READY":
                started = time.monotonic()
            elif line.startswith("CASE "):
                pending.pop(0)
                add(json.loads(line[5:]))
                started = time.monotonic()
        _end(worker)
    return pending


def _end(worker: subprocess.Popen, grace_s: float = 30.0) -> int:
    """The worker's exit status, once it has ended: killed if it has not within ``grace_s`` (a CUDA teardown that
    hangs must not hold the section past its budget)."""
    try:
        return worker.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        worker.kill()
        return worker.wait()


def _stopped(pending: list[Case], budget: bool, case_s: float, add: Callable[[dict], None]) -> list[Case]:
    """After the running case (``pending[0]``) was stopped, at the section's budget or past ``case_s``: its error,
    and the cases left to run (none of its kernel's past ``case_s``: they would compile as long)."""
    running = pending.pop(0)
    if budget:
        add(running.failed("stopped at the section's budget"))
        return pending
    add(running.failed(f"stopped after {case_s:.0f} s"))
    for c in [c for c in pending if c.kernel == running.kernel]:
        add(c.failed(f"skipped: its {running.seq_len} {running.mode} case was stopped after {case_s:.0f} s"))
    return [c for c in pending if c.kernel != running.kernel]


def _pump(stream: IO[str], lines: queue.Queue) -> None:
    """Each line of ``stream`` into ``lines``, then None at its end."""
    for line in stream:
        lines.put(line.rstrip("\n"))
    lines.put(None)


def _compared(section: dict[str, Any]) -> dict[str, Any]:
    """Each record with its share of the matmul ceiling and its time over SDPA flash's at the same T and mode."""
    flash = {
        (r["seq_len"], r["mode"]): r["ms"]
        for r in section["records"]
        if r["kernel"] == "sdpa_flash" and "ms" in r
    }
    for r in section["records"]:
        if "ms" in r and section["mm_tflops"]:
            r["mm_fraction"] = r["tflops_per_s"] / section["mm_tflops"]
        if "ms" in r and (r["seq_len"], r["mode"]) in flash:
            r["flash_time_ratio"] = r["ms"] / flash[(r["seq_len"], r["mode"])]
    return dict(section)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m tvq_exp.tools.bench.gpu_attention", description=__doc__.split("\n")[0]
    )
    p.add_argument("--cases", required=True, help="KERNEL:T:MODE,... in the order to run them")
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--device", default="cuda")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--tokens", type=int, default=TOKENS, help="B·H·T of every case")
    p.add_argument("--profiled", default=",".join(PROFILED), help="KERNEL:T,... whose cases are profiled too")
    args = p.parse_args(argv)
    try:
        cases = [Case.parse(c) for c in args.cases.split(",")]
    except ValueError as err:
        p.error(str(err))
    profiled = [x for x in args.profiled.split(",") if x]
    return work(cases, args.head_dim, torch.device(args.device), args.reps, args.tokens, profiled)


if __name__ == "__main__":
    sys.exit(main())
