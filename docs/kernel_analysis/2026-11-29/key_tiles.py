"""The forward's and ``dq``'s key tiles (and the keys' and codes' gradients' rows a step), compiled for sm_90a by
whichever Triton is first on the path: registers, spills, shared memory, SASS instructions per key (per row, in the
gradients) in each loop body, and the shared-memory bytes each product reads per tensor-core cycle.

Every tile loads by pointers, as the kernels did when its logs were written (since the eighteenth session the shipped
wide key tiles load through tensor descriptors: ``descriptor_loads.py``).

Run from the repository root, once with the venv's Triton and once with the lent GPUs' (3.6.0, as ``make
kernel-report-device`` installs it):

    .venv/bin/python docs/kernel_analysis/2026-11-29/key_tiles.py > docs/kernel_analysis/2026-11-29/key_tiles_3.8.log
    PYTHONPATH=.triton/3.6.0 .venv/bin/python docs/kernel_analysis/2026-11-29/key_tiles.py \
        > docs/kernel_analysis/2026-11-29/key_tiles_3.6.log

bf16, d_k = d_v = 128 (the GPU check's heads), S = L = 512, the kernels' largest variants (cache on; no XL bias with
whole tiles unmasked, or the bias). Loops are the SASS basic blocks that issue ``HGMMA``, in code order: the
forward's masked, whole and masked window runs, then its cache loop; ``dq``'s the same (its bias variant: one
masked window loop, then the cache); the keys' gradient's masked, whole and masked row runs (with the bias, one
masked run); the codes' gradient's one loop. Instructions are per thread (a warp issues each once).

Shared-memory bytes per tensor-core cycle, per product (``a·b``, from the TTGIR): one ``wgmma m64nNk16`` of a
warpgroup reads ``b``'s ``N×16`` slice from shared memory, and ``a``'s ``64×16`` slice too where ``a`` is in shared
memory (not in registers), and does ``64·N·16`` multiply-adds. At an H100 SXM's datasheet rate (989 TFLOP/s bf16
dense, 132 multiprocessors, 1830 MHz) a multiprocessor does 2048 multiply-adds a cycle, so the product takes
``N/2`` cycles and reads ``(a + b bytes) / (N/2)`` bytes a cycle. A multiprocessor's shared memory delivers 128 bytes
a cycle: a product over that runs at most ``128 / its rate`` of the tensor cores' peak while it runs alone, and a
kernel whose products together read more than that (``all products``) is bounded by shared memory however its
products overlap. A model, not a timing.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import tempfile

import triton

from tvq_exp.attention.vq.fused import report
from tvq_exp.attention.vq.fused.config import Tiles, tiles

MACS_PER_CYCLE = 2048  # per multiprocessor: 989.4e12 / 2 / (132 · 1.83e9)
SHARED_BYTES_PER_CYCLE = 128
# besides the shipped tiles (first): the tiles shipped before (the forward 128 × 64 and dq 64 × 32 without the bias);
# for the keys' and codes' gradients (a program per 128 keys or codes), other rows a step (the keys' with the bias: 16
# before)
CANDIDATES = {
    "forward": ((128, 64, 8), (128, 128, 8)),
    "dq": ((64, 32, 4), (64, 64, 4), (128, 64, 8)),
    "window_key": ((16, 128, 8), (32, 128, 8), (64, 128, 8)),
    "code": ((64, 128, 8),),
}
DOT = re.compile(
    r"^( *)%\S+ = ttng\.warp_group_dot (%[\w#]+),[^\n]*?: (tensor|!ttg\.memdesc)<(\d+)x(\d+)x\w+[^\n]*? \* "
    r"!ttg\.memdesc<(\d+)x(\d+)x\w+[^\n]*?-> tensor<(\d+)x(\d+)xf32, (#mma\d*)>",
    re.MULTILINE,
)
# a SASS instruction's opcode with its modifiers, after its address and predicate
OPCODE = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)")
# a value loaded from shared memory into registers (``ldmatrix``): ``%name = ttg.local_load``, with its indentation
LOCAL_LOAD = re.compile(r"^( *)(%[\w#]+) = ttg\.local_load ", re.MULTILINE)
_captured: dict[str, object] = {}
_row = report._row


def _grab(kernel: str, d_k: int, d_v: int, dtype: str, t: Tiles, compiled: object) -> report.Row:
    _captured["compiled"] = compiled
    return _row(kernel, d_k, d_v, dtype, t, compiled)


def loop_ops(cubin: bytes, *names: str) -> list[tuple[int, ...]]:
    """SASS instructions per thread of each basic block that issues ``HGMMA``, in code order, and how many of them
    are each of ``names`` (opcodes without their modifiers)."""
    nvdisasm = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([nvdisasm, "-c", f.name], capture_output=True, text=True, check=True).stdout
    sizes = []
    for block in re.split(r"\n(?=\.L_x_\d+:)", sass):
        ops = [op.split(".")[0] for op in OPCODE.findall(block)]
        if "HGMMA" in ops:
            sizes.append((len(ops), *(ops.count(name) for name in names)))
    return sizes


def loops(cubin: bytes) -> list[tuple[int, int]]:
    """:func:`loop_ops` with the ``FMUL`` count (in the forward and ``dq``, mostly the accumulator's rescaling)."""
    return loop_ops(cubin, "FMUL")


def shared_rates(ttgir: str) -> list[str]:
    """Each distinct product ``MxK · KxN`` with its shared-memory bytes per tensor-core cycle, then all the kernel's
    products together (a loop step's: every loop computes the same products), each counted by its instructions
    (``M/64 · K/16 · N/n`` of ``wgmma m64nNk16``, one per warpgroup). ``a`` is read from shared memory by the tensor
    cores (``smem``), loaded from it into registers by ``ldmatrix`` for each product (``ldsm``: a ``ttg.local_load``
    beside the product, in its loop body; the same bytes), or made in registers (``regs``: computed, or loaded once
    outside the loop)."""
    layouts = {m[1]: int(m[4]) for m in report.HOPPER_LAYOUT.finditer(ttgir)}
    loaded = {(m[1], m[2]) for m in LOCAL_LOAD.finditer(ttgir)}  # (indentation, name)
    out, read, cycles = [], 0.0, 0.0
    for m in DOT.finditer(ttgir):
        indent, a_name, a_kind = m[1], m[2], m[3]
        rows, k, n_tile, lay = int(m[4]), int(m[5]), int(m[9]), m[10]
        where = "smem" if a_kind != "tensor" else "ldsm" if (indent, a_name) in loaded else "regs"
        n = layouts[lay]  # the instruction's N
        one_read = (64 * 16 * 2 if where != "regs" else 0) + n * 16 * 2
        one_cycles = 64 * n * 16 / MACS_PER_CYCLE
        count = rows // 64 * k // 16 * n_tile // n
        read, cycles = read + count * one_read, cycles + count * one_cycles
        text = f"{rows}x{k}({where})·{k}x{n_tile} n{n}: {one_read / one_cycles:.0f} B/cycle"
        if text not in out:
            out.append(text)
    return [*out, f"all products: {read / cycles:.0f} B/cycle"]


def item_work(kernel: str, t: Tiles, sizes: list[int]) -> str:
    """Warp instructions of one item's 512 rows of one head, and their issue cycles (four schedulers a
    multiprocessor) per tensor-core cycle of the products the tiles compute. No XL bias, no sliding window: the loops
    are the masked run before the whole tiles (empty here), the whole run, the masked run after it and the cache;
    row block ``pp`` sees ``512 + pp·bm`` keys in whole tiles, the ``bm`` keys of its diagonal in masked ones, and
    512 codes. Multiply-adds per row and key: ``d_k + d_v`` in the forward (``q·kᵀ``, ``p·v``), ``2·d_k + d_v`` in
    ``dq`` (``q·kᵀ``, ``dO·vᵀ``, ``dS·k``)."""
    _, whole, after, cache = (size / t.bn for size in sizes)
    blocks = range(512 // t.bm)
    warps = t.num_warps * sum((512 + pp * t.bm) * whole + t.bm * after + 512 * cache for pp in blocks)
    keys = sum(512 + pp * t.bm + t.bm + 512 for pp in blocks)
    macs = keys * t.bm * (256 if kernel == "forward" else 384)
    return f"warp instructions per item {round(warps)}, issue / tensor cycles {warps / 4 / (macs / MACS_PER_CYCLE):.2f}"


def main() -> None:
    report._row = _grab
    print(f"Triton {triton.__version__}, sm_90a, bf16, d_k = d_v = 128, S = L = 512")
    for kernel, name, flags in report.variants(128, 128, False):
        if kernel not in CANDIDATES:
            continue
        bias = bool(flags["HAS_BIAS"])
        base = tiles(kernel, 128, 128, bias=bias, block=report.BLOCK, codes=report.CODES)
        base = dataclasses.replace(base, tma=False)  # by pointers, as its logs
        shapes = [(base.bm, base.bn, base.num_warps)]
        shapes += [shape for shape in CANDIDATES[kernel] if shape not in shapes]
        for bm, bn, warps in shapes:
            t = dataclasses.replace(base, bm=bm, bn=bn, num_warps=warps)
            report.tiles = lambda *_, t=t, **__: t
            r = report.compile_one(kernel, flags, 128, 128, "bf16")
            compiled = _captured["compiled"]
            sizes, fmuls = zip(*loops(compiled.asm["cubin"]), strict=True)
            keys = kernel in ("forward", "dq")  # a step's unit: a key, or (the gradients') a row
            whole = keys and len(sizes) == 4
            per_item = f"; {item_work(kernel, t, list(sizes))}" if whole else ""
            print(f"{kernel} {name:11s} {bm}x{bn} w{warps} s{t.num_stages}{' (shipped)' if t == base else ''}: "
                  f"regs {r.registers} spills {r.spill_bytes} B smem {r.shared_bytes} B; loops per "
                  f"{'key' if keys else 'row'} {[round(s / (bn if keys else bm), 2) for s in sizes]} (per loop body {list(sizes)}, of them FMUL "
                  f"{list(fmuls)}){per_item}; "
                  f"{'; '.join(shared_rates(compiled.asm['ttgir']))}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
