"""Attention and model benchmarks: time, tokens/s, peak memory and FLOP utilisation.

Usage::

    python -m tvq_exp.bench attention --backends dense,vq --lengths 2048,8192,16384,32768 \\
        --mode fwd,fwdbwd --json attn.json [--plot attn.png] [--device cpu|cuda] [--dtype fp32|bf16]
    python -m tvq_exp.bench model --models gau_dense,gau_vq,gau_linear,gau_flash,mha_dense \\
        --lengths 1024,2048,4096,8192,16384,32768 --json model.json --plot model.png

Method:
- Every configuration runs in a **fresh subprocess** (``python -m tvq_exp.tools.bench _worker SPEC``):
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
- **FLOPs**: each backend's and model's ``flops()`` (matmuls only: the attention call, or the model's whole training
  step); ``gflops_per_s = gflops / (ms / 1000)`` and ``mm_fraction`` is that over the ``torch.mm``
  GFLOP/s (square matmul of ``--mm-size`` in ``--dtype``) measured by the same run in a worker of
  its own, before and after the configurations (the larger of the two is the reference).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch

from tvq_exp.files import OutputError, UnsafePathError, check_writable
from tvq_exp.tools.arguments import (
    OneLineParser,
    non_negative_float,
    non_negative_int,
    output_file,
    positive_float,
    positive_int,
)
from tvq_exp.tools.bench.cases import worker_main
from tvq_exp.tools.bench.driver import MODEL_SETTINGS, run


def model_override(text: str) -> tuple[str, str]:
    """``[MODEL:]KEY=VALUE`` -> ``(MODEL or "*", "KEY=VALUE")``."""
    model, _, item = text.rpartition(":") if ":" in text.split("=", 1)[0] else ("*", "", text)
    if "=" not in item or not item.split("=", 1)[0]:
        raise argparse.ArgumentTypeError(
            f"--set takes [MODEL:]KEY=VALUE (e.g. gau_dense:block.position=none), got {text!r}"
        )
    return model or "*", item


def _csv(cast: Callable[[str], Any]) -> Callable[[str], list[Any]]:
    return lambda text: [cast(x) for x in text.split(",") if x]


def lengths(text: str) -> list[int]:
    """``--lengths``: comma-separated positive integers (``0``, ``-5`` or ``abc`` refused in one line)."""
    values = [x.strip() for x in text.split(",") if x.strip()]
    if not values or not all(x.isdigit() and int(x) > 0 for x in values):
        raise argparse.ArgumentTypeError(f"must be comma-separated positive integers, got {text!r}")
    return [int(x) for x in values]


def check_names(args: argparse.Namespace) -> None:
    """``--backends`` / ``--models`` name what exists: an attention backend, a ``conf/model`` preset (or
    variant, optionally ``@<conf/codebook preset>``); ``--mode`` one the command runs. :class:`SystemExit` with
    one ``error:`` line otherwise."""
    from tvq_exp.attention.registry import BACKENDS
    from tvq_exp.tools.bench.cases import CONF_DIR, KERNEL_VARIANTS, MODEL_VARIANTS, split_codebook

    if args.command == "attention":
        known, given, option = set(BACKENDS) | set(KERNEL_VARIANTS), args.backends, "--backends"
        unknown = [name for name in given if name not in known]
    else:
        presets = {p.stem for p in (CONF_DIR / "model").glob("*.yaml")}
        codebooks = {p.stem for p in (CONF_DIR / "codebook").glob("*.yaml")}
        known, given, option = presets | set(MODEL_VARIANTS), args.models, "--models"
        unknown = [
            name for name in given
            if split_codebook(name)[0] not in known or split_codebook(name)[1] not in codebooks
        ]  # fmt: skip
        known |= {f"<model>@{c}" for c in codebooks}
    if unknown or not given:
        raise SystemExit(f"error: {option}={','.join(given)}: unknown {', '.join(unknown) or '(none given)'}; "
                         f"choose from {', '.join(sorted(known))}")  # fmt: skip
    allowed = {"attention": {"fwd", "fwdbwd"}, "model": {"train", "fwd"}}[args.command]
    if not args.mode or not set(args.mode) <= allowed:
        raise SystemExit(f"error: --mode={','.join(args.mode)}: must be {' and/or '.join(sorted(allowed))}")


def parser() -> argparse.ArgumentParser:
    """The command-line interface (see the module docstring)."""
    p = OneLineParser(prog="python -m tvq_exp.bench", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    common = OneLineParser(add_help=False)
    common.add_argument("--lengths", type=lengths, default=[1024, 2048, 4096, 8192, 16384, 32768])
    common.add_argument("--json", type=output_file(".json"), help="write the records to this JSON file")
    common.add_argument("--plot", type=output_file(".png"), help="write a log-log PNG plot here")
    common.add_argument(
        "--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"]
    )
    common.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    common.add_argument(
        "--reps", type=positive_int, default=5, help="timed calls after the warm-up (at most)"
    )
    common.add_argument(
        "--budget", type=non_negative_float, default=20.0, help="seconds of timed calls per configuration"
    )
    common.add_argument(
        "--timeout", type=positive_float, default=300.0, help="seconds per configuration before skipping"
    )
    common.add_argument(
        "--threads", type=non_negative_int, default=0, help="torch threads (0: all available)"
    )
    common.add_argument("--window-bias", action="store_true", help="XL bias in the attention backends")
    common.add_argument(
        "--mm-size", type=positive_int, default=2048, help="size of the torch.mm reference matmul"
    )
    common.add_argument(
        "--mem-limit-mb",
        type=non_negative_float,
        default=0,
        help="CPU: memory a configuration may add (0: no limit)",
    )
    att = sub.add_parser("attention", parents=[common], help="one attention backend on (B, H, T, d) inputs")
    att.add_argument("--backends", type=_csv(str), default=["dense", "vq"])
    att.add_argument("--mode", type=_csv(str), default=["fwd", "fwdbwd"])
    mod = sub.add_parser("model", parents=[common], help="training step of a Hydra model preset")
    mod.add_argument(
        "--models", type=_csv(str), default=["gau_dense", "gau_vq", "gau_linear", "gau_flash", "mha_dense"]
    )
    mod.add_argument(
        "--mode",
        type=_csv(str),
        default=["train"],
        help="train (a whole training step) and/or fwd (inference)",
    )
    mod.add_argument("--d-model", type=positive_int, default=MODEL_SETTINGS["d_model"], help="model width")
    mod.add_argument("--n-layers", type=positive_int, default=MODEL_SETTINGS["n_layers"], help="blocks")
    mod.add_argument(
        "--set",
        type=model_override,
        action="append",
        default=[],
        metavar="[MODEL:]KEY=VALUE",
        help="override below model. for one preset (or all), e.g. gau_dense:block.position=none; +KEY adds a key",
    )
    return p


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]] | None:
    """Entry point; ``_worker SPEC`` is the internal per-configuration subprocess."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["_worker"]:
        worker_main(argv[1])
        return None
    args = parser().parse_args(argv)
    check_names(args)
    try:
        for output in (args.json, args.plot):
            if output is not None:
                check_writable(output.parent)  # a read-only or full folder stops now, not after the sweep
        records = run(args)
    except (OutputError, UnsafePathError) as error:
        raise SystemExit(f"error: {' '.join(str(error).split())}") from None
    failed = [f"{r['backend']} {r['mode']} T={r['seq_len']}" for r in records if failed_record(r)]
    if failed:
        raise SystemExit(
            f"error: {len(failed)} of {len(records)} configurations failed ({', '.join(failed[:4])}"
            f"{' ...' if len(failed) > 4 else ''}): see their 'error' above"
        )
    return records


def failed_record(record: dict[str, Any]) -> bool:
    """A configuration that did not run (a crashed worker, an unknown backend); being out of memory or too slow
    is a measurement, not a failure."""
    error = str(record.get("error") or "")
    return bool(error) and not error.startswith(("out of memory", "skipped: too slow"))
