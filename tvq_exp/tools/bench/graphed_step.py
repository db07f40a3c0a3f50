"""The paper-size training step with and without the host's launching: ``python -m tvq_exp.tools.bench.graphed_step``.

The GPU check's training section trains ``experiment=enwik8_paper`` through ``train.py`` and found its step bound by
the host (one H200, 2026-11-30: 257 ms of device time in a step of 380 ms, 6,903 launches). This tool says what the
same step's device work allows when no host launches it: the module's compiled training step (``module.compile``,
``compile_scope=blocks``: the forward and loss, the backward, the gradient clipping, a fused AdamW step and the codebook
updates) at each TBPTT position of a sequence, run eagerly (compiled blocks, launched by the host) and then captured in
one CUDA graph per position and replayed, the carried state handed from each position's graph to the next's in place.
Both run in one process on the same tensors, so ``host_share`` (``1 - graphed / eager`` time per step) is the share of
the eager step's wall clock that the host's launching costs. MFU as the throughput callback counts it: the model's
matmul FLOPs per token (:meth:`~tvq_exp.models.decoder.Decoder.flops`, forward + backward) against the measured bf16
matmul rate and the device's datasheet peak.

Tokens are random bytes (the step's work does not depend on them), the same at every replay; gradient clipping and the
optimiser run as the module's do, at a constant learning rate. What is left out: logging and its host reads, the
module's non-finite check (a step is never skipped here), the data loader.

The JSON (``--out``, and on stdout): ``batch``, ``seq_len``, ``positions``, ``compile_s`` (the first eager sequence:
compilation and warm-up), ``eager_ms_per_step`` and ``graphed_ms_per_step`` (medians over whole sequences),
``host_share``, ``tokens_per_s``, ``tflops_per_s``, ``mfu``, ``mfu_datasheet`` (both for the graphed step, and
``eager_mfu``), ``peak_mem_mb``, and ``losses`` (the last eager and graphed sequence's, each position's: finite, and
close, as a sanity check). The eager figures are written first; a capture that fails leaves them with
``graphed_error``. Off CUDA it says so in one line and exits 0, as ``make bench-gpu`` does.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

# the paper step as the GPU check trains it: one device (the batch: :func:`with_batch`), TBPTT updates of 2048
PRESET = ("experiment=enwik8_paper", "trainer=gpu", "trainer.devices=1", "global_batch_size=null")


def compose_run(overrides: Sequence[str]) -> dict[str, Any]:
    """``conf/train.yaml`` composed with ``overrides``: its ``model``, ``module`` and ``data`` resolved to plain
    containers (the run's folders, which only a Hydra run resolves, are not needed)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    import tvq_exp.resolvers  # noqa: F401 - the config tree's resolvers
    from tvq_exp.tools.bench.cases import CONF_DIR

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=list(overrides))
    return {key: OmegaConf.to_container(cfg[key], resolve=True) for key in ("model", "module", "data")}


class Stepper:
    """The module's training step at each TBPTT position of one batch of sequences.

    ``tokens[p] (B, seq_len + 1)``: position ``p``'s inputs and targets (random bytes). :meth:`step` runs position
    ``p`` from the state position ``p - 1`` left (none at ``p = 0``: a new sequence) and keeps its state for ``p + 1``.
    """

    def __init__(self, config: dict[str, Any], device: torch.device, seed: int = 0) -> None:
        from tvq_exp.run.build import build_module

        torch.manual_seed(seed)
        self.module = build_module(config).to(device)
        self.module.train()
        if self.module.compile:
            self.module.compile_step()
        data, self.device = config["data"], device
        self.batch, self.seq_len = int(data["batch_size"]), int(data["seq_len"])
        self.positions = int(data["sequence_len"]) // self.seq_len
        gen = torch.Generator(device="cpu").manual_seed(seed)
        shape = (self.positions, self.batch, self.seq_len + 1)
        self.tokens = torch.randint(0, self.module.model.vocab_size, shape, generator=gen).to(device)
        params = list(self.module.model.parameters())
        # constant learning rate, on the device: a captured step reads it there
        lr = torch.tensor(self.module.lr, device=device) if device.type == "cuda" else self.module.lr
        capturable = {"capturable": True, "fused": True} if device.type == "cuda" else {}
        self.optimizer = torch.optim.AdamW(
            params, lr=lr, betas=self.module.betas, eps=self.module.eps, **capturable
        )
        self.clip = self.module.grad_clip if self.module.grad_clip > 0 else math.inf
        self.apply = torch.ones((), dtype=torch.bool, device=device)
        self.states: list[Any] = [None] * self.positions
        self.losses: list[torch.Tensor] = [torch.zeros((), device=device)] * self.positions

    def step(self, p: int) -> torch.Tensor:
        """Position ``p``'s training step; its loss (the module's, without the auxiliary losses)."""
        from tvq_exp.models.decoder import detach_state

        tokens = self.tokens[p]
        state = None if p == 0 else self.states[p - 1]
        autocast = torch.autocast(self.device.type, torch.bfloat16, cache_enabled=False)
        with autocast if self.device.type == "cuda" else torch.autocast("cpu", enabled=False):
            loss, out = self.module.step_loss(tokens[:, :-1], tokens[:, 1:], state)
            total = loss + out.aux["loss"]
        total.backward()
        torch.nn.utils.clip_grad_norm_(self.module.model.parameters(), self.clip, foreach=True)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=False)
        self.module.codebook_update(self.apply)
        self.states[p] = detach_state(out.state)
        self.losses[p] = loss.detach()
        return self.losses[p]

    def sequence(self) -> None:
        """Every position in turn: one sequence of ``positions`` steps."""
        for p in range(self.positions):
            self.step(p)

    def flops_per_step(self) -> int | None:
        """The model's matmul FLOPs of one step (forward + backward), as the throughput callback counts them."""
        return self.module.model.flops(self.seq_len, self.batch, backward=True)


def capture(stepper: Stepper) -> list[torch.cuda.CUDAGraph]:
    """One CUDA graph per position, captured in order into one memory pool: position ``p``'s graph reads the state
    tensors position ``p - 1``'s graph wrote (its outputs, alive between replays), and writes its own in place."""
    graphs: list[torch.cuda.CUDAGraph] = []
    pool = None
    for p in range(stepper.positions):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            stepper.step(p)
        pool = graph.pool()
        graphs.append(graph)
    return graphs


def timed_sequences(run: Callable[[], None], device: torch.device, seconds: float) -> list[float]:
    """Wall-clock seconds of whole sequences (``run``), synchronised, for about ``seconds`` (at least 2)."""
    times: list[float] = []
    deadline = time.perf_counter() + seconds
    while len(times) < 2 or time.perf_counter() < deadline:
        torch.cuda.synchronize(device)
        start = time.perf_counter()
        run()
        torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return times


def measure(
    overrides: Sequence[str],
    seconds: float,
    device: torch.device,
    save: Callable[[dict[str, Any]], None] = print,
) -> dict[str, Any]:
    """The figures of the module docstring for the run ``PRESET + overrides``; ``save`` gets them after the eager
    part too (a capture that fails, or a call cut short, leaves the eager figures and ``graphed_error``)."""
    from tvq_exp.measure.peaks import device_peak_flops
    from tvq_exp.measure.timing import matmul_peak_flops

    if device.type != "cuda":
        raise RuntimeError(f"a CUDA graph needs a CUDA device, not {device.type!r}")
    peak, datasheet = matmul_peak_flops(device, torch.bfloat16), device_peak_flops(device)
    stepper = Stepper(compose_run([*PRESET, *overrides]), device)
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):  # compilation and warm-up (a capture wants its kernels and blocks made)
        started = time.perf_counter()
        stepper.sequence()
        torch.cuda.synchronize(device)
        compile_s = time.perf_counter() - started
        eager = statistics.median(timed_sequences(stepper.sequence, device, seconds / 2)) / stepper.positions
    torch.cuda.current_stream(device).wait_stream(side)
    tokens, flops = stepper.batch * stepper.seq_len, stepper.flops_per_step()
    result: dict[str, Any] = {
        "overrides": list(overrides), "batch": stepper.batch, "seq_len": stepper.seq_len,
        "positions": stepper.positions, "compile_s": compile_s, "matmul_tflops": peak / 1e12,
        "eager_ms_per_step": eager * 1e3, "eager_tokens_per_s": tokens / eager,
        **rates("eager_", flops, eager, peak, datasheet),
        "losses": {"eager": [float(x) for x in stepper.losses]},
        "peak_mem_mb": torch.cuda.max_memory_allocated(device) / 2**20,
    }  # fmt: skip
    save(result)
    try:
        graphs = capture(stepper)
        replay = timed_sequences(lambda: [g.replay() for g in graphs], device, seconds / 2)
    except Exception as err:  # noqa: BLE001 - the eager figures stand; the capture's failure is reported
        result["graphed_error"] = f"{type(err).__name__}: {str(err).strip()[:300]}"
        save(result)
        return result
    graphed = statistics.median(replay) / stepper.positions
    result |= {
        "graphed_ms_per_step": graphed * 1e3, "host_share": 1 - graphed / eager, "tokens_per_s": tokens / graphed,
        **rates("", flops, graphed, peak, datasheet),
        "peak_mem_mb": torch.cuda.max_memory_allocated(device) / 2**20,
    }  # fmt: skip
    result["losses"]["graphed"] = [float(x) for x in stepper.losses]
    save(result)
    return result


def rates(
    prefix: str, flops: int | None, seconds: float, peak: float, datasheet: float | None
) -> dict[str, float]:
    """``{prefix}tflops_per_s``, ``{prefix}mfu`` (of the measured ``peak``) and ``{prefix}mfu_datasheet`` of a step of
    ``flops`` in ``seconds`` (none without a FLOP count; the last without a datasheet peak)."""
    if flops is None:
        return {}
    rate = flops / seconds
    out = {f"{prefix}tflops_per_s": rate / 1e12, f"{prefix}mfu": rate / peak}
    if datasheet is not None:
        out[f"{prefix}mfu_datasheet"] = rate / datasheet
    return out


def with_batch(overrides: Sequence[str], device_bytes: int) -> list[str]:
    """``overrides`` with the GPU check's batch for a device of ``device_bytes`` first (the paper's 16 where it fits,
    else 8: :func:`~tvq_exp.tools.bench.gpu.batch_sizes`), unless they choose one."""
    from tvq_exp.tools.bench.gpu import batch_sizes

    if any(o.split("=")[0].lstrip("+") == "data.batch_size" for o in overrides):
        return list(overrides)
    return [f"data.batch_size={batch_sizes('auto', device_bytes)[0]}", *overrides]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m tvq_exp.tools.bench.graphed_step", description=__doc__.split("\n")[0]
    )
    p.add_argument(
        "overrides", nargs="*", help="train.py overrides after the paper step's (data.batch_size=8, ...)"
    )
    p.add_argument("--seconds", type=float, default=40.0, help="timing, eager and graphed together")
    p.add_argument("--out", type=Path, default=None, help="the JSON's file (also printed)")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("graphed_step: skipped, no CUDA device here (torch.cuda.is_available() is False)")
        return 0

    def save(result: dict[str, Any]) -> None:
        text = json.dumps(result, indent=1)
        if args.out is not None:
            args.out.write_text(text + "\n")
        print(text, flush=True)

    measure(with_batch(args.overrides, torch.cuda.get_device_properties(0).total_memory), args.seconds,
            torch.device("cuda"), save)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
