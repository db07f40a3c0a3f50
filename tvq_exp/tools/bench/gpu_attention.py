"""The GPU check's attention section, one kernel per process: ``python -m tvq_exp.tools.bench.gpu_attention KERNEL``.

Causal attention, bf16, head dim ``d`` (128: where SDPA's flash kernel runs), ``S = L = 512``, at each ``T`` with
``B·H·T`` fixed (512k tokens: ``B·H`` = 64 / 16 / 4 at T = 8k / 32k / 128k; ``H = 4``), forward (``fwd``) and
forward + backward (``fwdbwd``). Kernels (:data:`KERNELS`):

- ``vq_triton``, ``vq_flex``, ``vq_plain``: :class:`~tvq_exp.attention.vq.VQAttention` with that ``kernel`` (keys
  quantised by the layer's own codebook, the cache on, no XL bias);
- ``sdpa_flash``, ``sdpa_cudnn``: ``F.scaled_dot_product_attention(is_causal=True)`` restricted to that SDPA
  backend (``torch.nn.attention.sdpa_kernel``); an error where torch has no such kernel for the shape;
- ``dense_flex``: the dense backend's compiled flex-attention kernel (``kernel=flex``);
- ``vq_triton_compiled``: ``vq_triton``'s layer under ``torch.compile`` (as ``module.compile`` runs it in training):
  the quantiser, the cache's running means and the layout around the fused kernels become inductor's kernels, the
  fused op (two custom ops, ``tvq::window_cache_forward`` / ``_backward``) is one node of the compiled graph.

Each measurement prints one ``CASE {json}`` line as soon as it is done (the parent keeps what came before a
timeout): ``ms`` (median of CUDA-synchronised calls after a warm-up, which includes any compilation),
``flops`` and ``tflops_per_s``. FLOPs, useful work: dense causal attention ``2·B·H·T²·d`` forward (half of the
``4·B·H·T²·d`` of the full square; FlashAttention's convention) and 3.5 times that with the backward; VQ its
layer's :meth:`~tvq_exp.attention.vq.VQAttention.flops` (the same for every kernel). A case that fails (no such
kernel, out of memory) prints its error and the next runs; once ``--budget`` seconds are spent the rest print
``skipped: budget``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from tvq_exp.measure.timing import sync, time_calls

# in this order: the GPU check gives each kernel an equal share of what is left, so the kernel that needs the most
# (VQ's fused kernel: its compilation took the whole 22 s share of 130 s on an H100) runs last and takes what the
# others left
KERNELS = ("sdpa_flash", "sdpa_cudnn", "vq_flex", "vq_plain", "dense_flex", "vq_triton", "vq_triton_compiled")
LENGTHS = (8192, 32768, 131072)
TOKENS = 512 * 1024  # B·H·T
HEADS = 4
MODES = ("fwd", "fwdbwd")


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


def _layer(kernel: str, head_dim: int, device: torch.device) -> Any:
    from tvq_exp.attention import build_attention

    if kernel == "dense_flex":
        return build_attention("dense", d_k=head_dim, d_v=head_dim, heads=HEADS, kernel="flex").to(device)
    opts = {
        "codebook_size": 512,
        "block_len": 512,
        "kernel": kernel.removeprefix("vq_").removesuffix("_compiled"),
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
        layer = _layer(kernel, head_dim, device)
        run = torch.compile(layer, dynamic=False) if kernel.endswith("_compiled") else layer
        attend = lambda q, k, v: run(q, k, v)[0]  # noqa: E731
        flops = layer.flops(seq_len, batch, backward=train) if kernel.startswith("vq") else None
        flops = flops or dense_flops(batch * HEADS, seq_len, head_dim, train)

    def call() -> None:
        with torch.set_grad_enabled(train), torch.autocast(device.type, torch.bfloat16):
            out = attend(q, k, v)
        if grad is not None:
            out.backward(grad)

    return call, flops


def measure(
    kernel: str, seq_len: int, mode: str, head_dim: int, device: torch.device, reps: int, tokens: int = TOKENS
) -> dict[str, Any]:
    """One configuration: ``{ms, flops, tflops_per_s}`` or ``{error}``."""
    try:
        call, flops = case(kernel, seq_len, mode, head_dim, device, tokens)
        times = time_calls(call, device, reps, budget_s=5.0)
    except Exception as err:  # noqa: BLE001 - any failure of one case is recorded, the next case runs
        return {
            "error": f"{type(err).__name__}: {str(err).strip().splitlines()[0][:200] if str(err).strip() else ''}"
        }
    finally:
        if device.type == "cuda":
            torch.cuda.empty_cache()
    ms = sorted(times)[len(times) // 2]
    return {"ms": ms, "flops": flops, "tflops_per_s": flops / (ms / 1e3) / 1e12}


def run(
    kernel: str,
    lengths: Sequence[int],
    head_dim: int,
    device: torch.device,
    budget_s: float,
    reps: int,
    tokens: int = TOKENS,
) -> list[dict[str, Any]]:
    """Every length and mode of ``kernel``, one ``CASE`` line each as it is done."""
    start, records = time.monotonic(), []
    for seq_len in lengths:
        for mode in MODES:
            record = {"kernel": kernel, "seq_len": seq_len, "mode": mode, "head_dim": head_dim,
                      "batch_heads": HEADS * max(1, tokens // (seq_len * HEADS))}  # fmt: skip
            if time.monotonic() - start > budget_s:
                record["error"] = "skipped: budget"
            else:
                record |= measure(kernel, seq_len, mode, head_dim, device, reps, tokens)
            sync(device)
            print("CASE " + json.dumps(record), flush=True)
            records.append(record)
    return records


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m tvq_exp.tools.bench.gpu_attention", description=__doc__.split("\n")[0]
    )
    p.add_argument("kernel", choices=KERNELS)
    p.add_argument("--lengths", default=",".join(map(str, LENGTHS)))
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--device", default="cuda")
    p.add_argument(
        "--budget", type=float, default=60.0, help="seconds after which the remaining cases are skipped"
    )
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--tokens", type=int, default=TOKENS, help="B·H·T of every case")
    args = p.parse_args(argv)
    lengths = [int(n) for n in args.lengths.split(",")]
    run(args.kernel, lengths, args.head_dim, torch.device(args.device), args.budget, args.reps, args.tokens)
    return 0


if __name__ == "__main__":
    sys.exit(main())
