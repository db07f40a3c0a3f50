"""Attention and model benchmarks: time, tokens/s, peak memory and FLOP utilisation.

Usage::

    python -m tvq_exp.bench attention --backends dense,vq --lengths 2048,8192,16384,32768 \\
        --mode fwd,fwdbwd --json attn.json [--plot attn.png] [--device cpu|cuda] [--dtype fp32|bf16]
    python -m tvq_exp.bench model --models gau_dense,gau_vq,gau_linear,gau_flash,mha_dense \\
        --lengths 1024,2048,4096,8192,16384,32768 --json model.json --plot model.png

Method:
- Every configuration runs in a **fresh subprocess** (``python -m tvq_exp.bench _worker SPEC``):
  one warm-up call, then up to ``--reps`` timed calls (fewer when one call is slow, never fewer
  than one); ``ms`` is their median, ``ms_min`` the fastest. A crash, a kill by the kernel or an
  allocation failure is reported as ``"error": "out of memory ..."`` (``--mem-limit-mb`` caps what
  a CPU worker may allocate, to ask what fits in less memory); a configuration over
  ``--timeout`` seconds (measured, or extrapolated quadratically from the previous length) as
  ``"error": "skipped: too slow ..."``.
- **Peak memory**: on CPU the growth of the worker's resident set over the run: the kernel's
  high-water mark ``VmHWM`` is reset (``/proc/self/clear_refs``) after the inputs / model are built,
  and ``peak_mem_mb = VmHWM - VmRSS_at_reset`` after the warm-up and timed calls (everything the
  computation touched: activations, gradients, allocator caches). On CUDA,
  ``torch.cuda.max_memory_allocated`` minus the allocation at the start.
- **FLOPs**: :mod:`tvq_exp.flops` (matmuls only: the attention call, or the model's whole training
  step); ``gflops_per_s = gflops / (ms / 1000)`` and ``mm_fraction`` is that over the ``torch.mm``
  GFLOP/s (square matmul of ``--mm-size`` in ``--dtype``) measured by the same run in a worker of
  its own, before and after the configurations (the larger of the two is the reference).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from tvq_exp.attention import BACKENDS
from tvq_exp.flops import attention_flops, model_flops

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
ATTENTION_SETTINGS = {"batch": 1, "heads": 1, "d_k": 128, "d_v": 256, "codebook_size": 512, "block_len": 512}
MODEL_SETTINGS = {
    "d_model": 256,
    "n_layers": 4,
    "codebook_size": 512,
    "block_len": 512,
    "batch": 1,
    "vocab_size": 256,
}
RECORD_FIELDS = ("ms", "tokens_per_s", "peak_mem_mb", "gflops", "gflops_per_s", "mm_fraction")


# ----------------------------------------------------------------------------- worker side


def _read_status_kb(field: str) -> int:
    """A ``VmRSS`` / ``VmHWM`` field of ``/proc/self/status`` in kB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


class PeakMemory:
    """Peak memory growth from :meth:`start` to :meth:`peak_mb` (RSS high-water mark or CUDA)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.base = 0

    def start(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = torch.cuda.memory_allocated(self.device)
            return
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
        self.base = _read_status_kb("VmRSS") * 1024

    def peak_mb(self) -> float:
        if self.device.type == "cuda":
            return (torch.cuda.max_memory_allocated(self.device) - self.base) / 2**20
        return (_read_status_kb("VmHWM") * 1024 - self.base) / 2**20


def limit_address_space(extra_mb: float) -> None:
    """Let this process map at most ``extra_mb`` MiB beyond what it maps now (``RLIMIT_AS``): larger
    allocations then fail (and are reported as out of memory) instead of exhausting the machine."""
    import resource

    now = _read_status_kb("VmSize") * 1024
    resource.setrlimit(resource.RLIMIT_AS, (now + int(extra_mb * 2**20), resource.getrlimit(resource.RLIMIT_AS)[1]))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_calls(fn: Callable[[], None], device: torch.device, reps: int, budget_s: float) -> list[float]:
    """One warm-up call, then ``min(reps, budget_s / warm-up time)`` (at least 1) timed calls, in ms."""
    t0 = time.perf_counter()
    fn()
    _sync(device)
    warm = time.perf_counter() - t0
    n = max(1, min(reps, int(budget_s / max(warm, 1e-9))))
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def _autocast(device: torch.device, dtype: str) -> torch.autocast:
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=dtype == "bf16")


def attention_options(backend: str, settings: dict[str, Any], window_bias: bool) -> dict[str, Any]:
    """``build_attention`` options of ``backend`` for the benchmark settings."""
    opts: dict[str, Any] = {"d_k": settings["d_k"], "d_v": settings["d_v"], "heads": settings["heads"]}
    if backend == "vq":
        opts.update(
            codebook_size=settings["codebook_size"], block_len=settings["block_len"], window_bias=window_bias
        )
    elif backend == "dense":
        opts.update(window_bias=window_bias, window_len=settings["block_len"] if window_bias else None)
    return opts


def attention_case(spec: dict[str, Any], device: torch.device) -> tuple[Callable[[], None], int | None]:
    """The timed call of one attention configuration and its FLOPs (:mod:`tvq_exp.flops`)."""
    from tvq_exp.attention import build_attention

    s, t = spec["settings"], spec["seq_len"]
    dtype = torch.bfloat16 if spec["dtype"] == "bf16" else torch.float32
    opts = attention_options(spec["backend"], s, spec["window_bias"])
    attn = build_attention(spec["backend"], **opts).to(device)
    gen = torch.Generator(device="cpu").manual_seed(0)
    b, h, dk, dv = s["batch"], s["heads"], s["d_k"], s["d_v"]
    # GAU scaling: unit-RMS rows times d_k^-1/4, as the blocks feed the backends
    q, k = (torch.randn(b, h, t, dk, generator=gen) * dk**-0.25 for _ in range(2))
    v = torch.randn(b, h, t, dv, generator=gen)
    train = spec["mode"] == "fwdbwd"
    q, k, v = (x.to(device, dtype).requires_grad_(train) for x in (q, k, v))
    grad_out = torch.randn(b, h, t, dv, generator=gen).to(device, dtype) if train else None

    def call() -> None:
        with torch.set_grad_enabled(train), _autocast(device, spec["dtype"]):
            out, _, _ = attn(q, k, v)
        if grad_out is not None:
            out.backward(grad_out)  # a dense gradient: ``out.sum()`` would give a stride-0 one

    return call, attention_flops(spec["backend"], t, batch=b, backward=train, **opts)


def compose_model(name: str, settings: dict[str, Any]) -> Any:
    """The Hydra preset ``conf/model/<name>.yaml`` at the benchmark's width and depth, with the
    ``settings["overrides"]`` (``key=value`` below ``model.``) applied (a DictConfig)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf, open_dict

    if not (CONF_DIR / "model" / f"{name}.yaml").is_file():
        raise LookupError(f"unknown model preset {name!r}: no conf/model/{name}.yaml yet")
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = compose(overrides=[f"+model={name}", *(f"model.{item}" for item in settings.get("overrides", ()))])
    with open_dict(cfg):
        cfg.data = OmegaConf.create({"vocab_size": settings["vocab_size"]})
        cfg.model.d_model, cfg.model.n_layers = settings["d_model"], settings["n_layers"]
        if cfg.model.attention.get("name") == "vq":
            cfg.model.attention.codebook_size = settings["codebook_size"]
            cfg.model.attention.block_len = settings["block_len"]
    return cfg


def model_case(spec: dict[str, Any], device: torch.device) -> tuple[Callable[[], None], int | None]:
    """One training step (forward, backward, AdamW step, codebook step) of a model preset."""
    from hydra.utils import instantiate

    s, t = spec["settings"], spec["seq_len"]
    model = instantiate(compose_model(spec["backend"], s).model).to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
    gen = torch.Generator(device="cpu").manual_seed(0)
    tokens = torch.randint(0, s["vocab_size"], (s["batch"], t + 1), generator=gen).to(device)

    def call() -> None:
        with _autocast(device, spec["dtype"]):
            out = model(tokens[:, :-1])
            loss = torch.nn.functional.cross_entropy(
                out.logits.flatten(0, 1).float(), tokens[:, 1:].flatten()
            )
        (loss + out.aux["loss"]).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        model.codebook_step()

    return call, model_flops(model, t, s["batch"], backward=True)


def mm_case(spec: dict[str, Any], device: torch.device) -> tuple[Callable[[], None], int]:
    """A square ``torch.mm`` of size ``spec['size']`` in the benchmark's dtype."""
    n, dtype = spec["size"], torch.bfloat16 if spec["dtype"] == "bf16" else torch.float32
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    return (lambda: torch.mm(a, b)), 2 * n**3


CASES = {"attention": attention_case, "model": model_case, "mm": mm_case}


def run_worker(spec: dict[str, Any]) -> dict[str, Any]:
    """Measure one configuration in this process: ``{ms, ms_min, reps, peak_mem_mb, flops}``."""
    device = torch.device(spec["device"])
    if spec.get("threads"):
        torch.set_num_threads(spec["threads"])
    if spec.get("mem_limit_mb"):
        limit_address_space(spec["mem_limit_mb"])
    call, flops = CASES[spec["kind"]](spec, device)
    mem = PeakMemory(device)
    mem.start()
    times = time_calls(call, device, spec["reps"], spec["budget_s"])
    return {
        "ms": statistics.median(times),
        "ms_min": min(times),
        "reps": len(times),
        "peak_mem_mb": mem.peak_mb(),
        "flops": flops,
    }


def _worker_main(spec_json: str) -> None:
    try:
        result = run_worker(json.loads(spec_json))
    except (torch.OutOfMemoryError, MemoryError) as err:
        result = {"error": f"out of memory ({type(err).__name__})"}
    except RuntimeError as err:
        if "alloc" not in str(err).lower() and "memory" not in str(err).lower():
            raise
        result = {"error": f"out of memory ({str(err).splitlines()[0][:120]})"}
    except LookupError as err:
        result = {"error": str(err)}
    print("RESULT " + json.dumps(result), flush=True)


# ----------------------------------------------------------------------------- driver side


def measure(spec: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """Run :func:`run_worker` for ``spec`` in a fresh interpreter; failures become an ``error``."""
    cmd = [sys.executable, "-m", "tvq_exp.bench", "_worker", json.dumps(spec)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"error": f"skipped: too slow (over the {timeout_s:.0f} s timeout)"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    if proc.returncode in (-9, 137):
        return {"error": "out of memory (worker killed by the kernel)"}
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return {"error": f"worker failed (exit {proc.returncode}): {tail[:200]}"}


def mm_gflops(args: argparse.Namespace) -> float:
    """``torch.mm`` GFLOP/s of this machine, measured in a worker."""
    spec = {"kind": "mm", "size": args.mm_size, "device": args.device, "dtype": args.dtype, "reps": 10}
    spec |= {"budget_s": 5.0, "threads": args.threads}
    result = measure(spec, args.timeout)
    return result["flops"] / (result["ms"] / 1e3) / 1e9 if "ms" in result else float("nan")


def run_sweep(
    args: argparse.Namespace, kind: str, names: Sequence[str], modes: Sequence[str]
) -> list[dict[str, Any]]:
    """Measure every (name, mode, length); returns the records (without the mm fractions)."""
    records = []
    for name in names:
        for mode in modes:
            last: tuple[int, float] | None = None
            for t in args.lengths:
                rec = {
                    "backend": name,
                    "seq_len": t,
                    "mode": mode,
                    **_measure_one(args, kind, name, mode, t, last),
                }
                if rec.get("ms") is not None:
                    last = (t, rec["ms"])
                records.append(rec)
                print(_row(rec), flush=True)
    return records


def model_settings(args: argparse.Namespace, name: str) -> dict[str, Any]:
    """:data:`MODEL_SETTINGS` at ``--d-model`` / ``--n-layers``, with the ``--set`` overrides of model ``name``."""
    overrides = [item for model, item in args.set if model in ("*", name)]
    return MODEL_SETTINGS | {"d_model": args.d_model, "n_layers": args.n_layers, "overrides": overrides}


def _measure_one(
    args: argparse.Namespace,
    kind: str,
    name: str,
    mode: str,
    t: int,
    last: tuple[int, float] | None,
) -> dict[str, Any]:
    settings = ATTENTION_SETTINGS if kind == "attention" else model_settings(args, name)
    if kind == "attention" and name not in BACKENDS:
        return {
            "error": f"unknown backend {name!r} (not implemented yet; known: {', '.join(sorted(BACKENDS))})"
        }
    if last is not None:
        estimate = 2 * last[1] / 1e3 * (t / last[0]) ** 2  # warm-up + one call, quadratic in T
        if estimate > args.timeout:
            return {"error": f"skipped: too slow (estimated {estimate:.0f} s > {args.timeout:.0f} s timeout)"}
    spec = {
        "kind": kind, "backend": name, "seq_len": t, "mode": mode, "device": args.device, "dtype": args.dtype,
        "settings": settings, "window_bias": args.window_bias, "reps": args.reps, "budget_s": args.budget,
        "threads": args.threads, "mem_limit_mb": args.mem_limit_mb,
    }  # fmt: skip
    load = os.getloadavg()[0]
    result = measure(spec, args.timeout)
    tokens = settings["batch"] * t
    out: dict[str, Any] = {
        "device": args.device,
        "dtype": args.dtype,
        "threads": args.threads or torch.get_num_threads(),
    }
    out["load_avg_1min"] = round(load, 2)
    if kind == "model":
        out |= {"d_model": settings["d_model"], "n_layers": settings["n_layers"], "overrides": settings["overrides"]}
    if "ms" in result:
        flops = result.pop("flops", None)
        out.update(result, tokens_per_s=tokens / (result["ms"] / 1e3))
        if flops is not None:
            out.update(gflops=flops / 1e9, gflops_per_s=flops / 1e9 / (result["ms"] / 1e3))
    else:
        out.update(result)
    return out


def _fmt(value: Any, spec: str) -> str:
    return format("-", ">" + spec.split(".")[0]) if value is None else format(value, spec)


def _row(rec: dict[str, Any]) -> str:
    head = f"{rec['backend']:>12} {rec['mode']:>7} {rec['seq_len']:>7}"
    if "error" in rec:
        return f"{head}  {rec['error']}"
    cols = (
        _fmt(rec.get("ms"), "10.1f"), _fmt(rec.get("ms_min"), "10.1f"), _fmt(rec.get("tokens_per_s"), "12.0f"),
        _fmt(rec.get("peak_mem_mb"), "10.1f"), _fmt(rec.get("gflops_per_s"), "8.1f"), _fmt(rec.get("mm_fraction"), "6.2f"),
    )  # fmt: skip
    return f"{head} " + " ".join(cols) + f"  (reps {rec.get('reps')})"


def print_table(records: list[dict[str, Any]]) -> None:
    """The records as an aligned text table."""
    print(
        f"{'backend':>12} {'mode':>7} {'T':>7} {'ms(med)':>10} {'ms(min)':>10} {'tokens/s':>12} {'peak MB':>10} {'GFLOP/s':>8} {'mm%':>6}"
    )
    for rec in records:
        print(_row(rec))


def plot(records: list[dict[str, Any]], path: str, kind: str) -> None:
    """Log–log plot: time (attention) or tokens/s (model) and peak memory against length."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    speed_key, speed_label = (
        ("ms", "time per call (ms)") if kind == "attention" else ("tokens_per_s", "training tokens/s")
    )
    for (name, mode), recs in _group(records).items():
        ok = [r for r in recs if r.get("ms") is not None]
        label = name if kind == "model" else f"{name} {mode}"
        for ax, key in zip(axes, (speed_key, "peak_mem_mb"), strict=True):
            ax.plot([r["seq_len"] for r in ok], [max(r[key], 1e-3) for r in ok], marker="o", label=label)
    for ax, ylabel in zip(axes, (speed_label, "peak memory (MB)"), strict=True):
        ax.set(xscale="log", yscale="log", xlabel="sequence length", ylabel=ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _group(records: list[dict[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for rec in records:
        groups.setdefault((rec["backend"], rec["mode"]), []).append(rec)
    return groups


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Run the ``attention`` or ``model`` benchmark; write JSON / plot; return the records."""
    kind = args.command
    names, modes = (args.backends, args.mode) if kind == "attention" else (args.models, ["train"])
    mm_before = mm_gflops(args)
    print(f"torch.mm {args.mm_size}^2 {args.dtype}: {mm_before:.1f} GFLOP/s", flush=True)
    records = run_sweep(args, kind, names, modes)
    mm_after = mm_gflops(args)
    mm_ref = max(mm_before, mm_after)
    print(f"torch.mm {args.mm_size}^2 {args.dtype} after the run: {mm_after:.1f} GFLOP/s; reference {mm_ref:.1f}")
    for rec in records:
        rec["mm_gflops_per_s"] = mm_ref
        if rec.get("gflops_per_s") is not None:
            rec["mm_fraction"] = rec["gflops_per_s"] / mm_ref
    for rec in records:
        for field in RECORD_FIELDS:
            rec.setdefault(field, None)
    print_table(records)
    if args.json:
        Path(args.json).write_text(json.dumps(records, indent=1))
    if args.plot:
        plot(records, args.plot, kind)
    return records


def model_override(text: str) -> tuple[str, str]:
    """``[MODEL:]KEY=VALUE`` -> ``(MODEL or "*", "KEY=VALUE")``."""
    model, _, item = text.rpartition(":") if ":" in text.split("=", 1)[0] else ("*", "", text)
    if "=" not in item or not item.split("=", 1)[0]:
        raise argparse.ArgumentTypeError(f"--set takes [MODEL:]KEY=VALUE (e.g. gau_dense:block.position=none), got {text!r}")
    return model or "*", item


def _csv(cast: Callable[[str], Any]) -> Callable[[str], list[Any]]:
    return lambda text: [cast(x) for x in text.split(",") if x]


def parser() -> argparse.ArgumentParser:
    """The command-line interface (see the module docstring)."""
    p = argparse.ArgumentParser(prog="python -m tvq_exp.bench", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--lengths", type=_csv(int), default=[1024, 2048, 4096, 8192, 16384, 32768])
    common.add_argument("--json", help="write the records to this JSON file")
    common.add_argument("--plot", help="write a log-log PNG plot here")
    common.add_argument(
        "--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"]
    )
    common.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    common.add_argument("--reps", type=int, default=5, help="timed calls after the warm-up (at most)")
    common.add_argument("--budget", type=float, default=20.0, help="seconds of timed calls per configuration")
    common.add_argument(
        "--timeout", type=float, default=300.0, help="seconds per configuration before skipping"
    )
    common.add_argument("--threads", type=int, default=0, help="torch threads (0: all available)")
    common.add_argument("--window-bias", action="store_true", help="XL bias in the attention backends")
    common.add_argument("--mm-size", type=int, default=2048, help="size of the torch.mm reference matmul")
    common.add_argument(
        "--mem-limit-mb", type=float, default=0, help="CPU: memory a configuration may add (0: no limit)"
    )
    att = sub.add_parser("attention", parents=[common], help="one attention backend on (B, H, T, d) inputs")
    att.add_argument("--backends", type=_csv(str), default=["dense", "vq"])
    att.add_argument("--mode", type=_csv(str), default=["fwd", "fwdbwd"])
    mod = sub.add_parser("model", parents=[common], help="training step of a Hydra model preset")
    mod.add_argument(
        "--models", type=_csv(str), default=["gau_dense", "gau_vq", "gau_linear", "gau_flash", "mha_dense"]
    )
    mod.add_argument("--d-model", type=int, default=MODEL_SETTINGS["d_model"], help="model width")
    mod.add_argument("--n-layers", type=int, default=MODEL_SETTINGS["n_layers"], help="blocks")
    mod.add_argument(
        "--set",
        type=model_override,
        action="append",
        default=[],
        metavar="[MODEL:]KEY=VALUE",
        help="override below model. for one preset (or all), e.g. gau_dense:block.position=none",
    )
    return p


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]] | None:
    """Entry point; ``_worker SPEC`` is the internal per-configuration subprocess."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["_worker"]:
        _worker_main(argv[1])
        return None
    args = parser().parse_args(argv)
    if args.command == "attention" and not set(args.mode) <= {"fwd", "fwdbwd"}:
        raise SystemExit(f"--mode takes fwd and/or fwdbwd, got {','.join(args.mode)}")
    return run(args)


if __name__ == "__main__":
    main()
