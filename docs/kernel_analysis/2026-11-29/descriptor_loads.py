"""The forward's and ``dq``'s tiles loaded through tensor descriptors (the tensor-memory accelerator's bulk copies)
against by pointers, compiled for sm_90a by whichever Triton is first on the path: registers, spills, shared memory
and SASS instructions per thread in each loop body. Then a probe of Triton's automatic warp specialisation on Hopper.

Run from the repository root, once with the venv's Triton and once with the lent GPUs' (3.6.0, as ``make
kernel-report-device`` installs it):

    .venv/bin/python docs/kernel_analysis/2026-11-29/descriptor_loads.py \
        > docs/kernel_analysis/2026-11-29/descriptor_loads_3.8.log
    PYTHONPATH=.triton/3.6.0 .venv/bin/python docs/kernel_analysis/2026-11-29/descriptor_loads.py \
        > docs/kernel_analysis/2026-11-29/descriptor_loads_3.6.log

bf16, d_k = d_v = 128 (the GPU check's heads), then 64 (the small heads), S = L = 512, the cache on; the shipped
tiles of each variant. A loop is
the code from a label to the last branch back to it that issues ``HGMMA`` (``key_tiles.py`` counted basic blocks that
issue it, which a descriptor's wait splits); the waits' spin loops, placed after the function's last ``EXIT`` with
their branches back into the loops, are not loops here. The forward's and dq's loops without the bias: the masked run before the whole tiles, the whole run, the
masked run after, the cache; with the whole tiles' four loops, the warp instructions of one item's 512 rows of one
head and their issue cycles per tensor-core cycle (``key_tiles.item_work``), and the whole run's opcodes. Then the
forward and dq through descriptors with a third pipeline stage (the tile search's candidates).
"""

from __future__ import annotations

import collections
import dataclasses
import os
import re
import subprocess
import sys
import tempfile

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from tvq_exp.attention.vq.fused import report
from tvq_exp.attention.vq.fused.config import Tiles, tiles
from tvq_exp.attention.vq.fused.support import kernels

sys.path.insert(0, os.path.dirname(__file__))
import key_tiles  # noqa: E402 - beside this script: its count of one item's warp instructions


def sass(cubin: bytes) -> str:
    nvdisasm = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([nvdisasm, "-c", f.name], capture_output=True, text=True, check=True).stdout


def loops(text: str) -> list[collections.Counter]:
    """The SASS opcodes (counted) of each loop that issues ``HGMMA``, in code order."""
    at, ops = {}, []
    for line in text.splitlines():
        label = re.match(r"\s*(\.L_x_\d+):", line)
        if label:
            at[label[1]] = len(ops)
            continue
        op = re.search(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*)", line)
        if op:
            ops.append((op[1], op[2]))
    ends: dict[str, int] = {}
    last_exit = max(k for k, (op, _) in enumerate(ops) if op == "EXIT")  # the out-of-line waits come after it
    for k, (op, rest) in enumerate(ops[:last_exit]):
        target = re.search(r"(\.L_x_\d+)", rest) if op.startswith("BRA") else None
        if target and target[1] in at and at[target[1]] <= k:
            ends[target[1]] = k
    spans = sorted((at[label], end) for label, end in ends.items())
    bodies = [[o.split(".")[0] for o, _ in ops[a : b + 1]] for a, b in spans]
    return [collections.Counter(body) for body in bodies if "HGMMA" in body]


def fused(kernel: str, flags: dict[str, object], tma: bool, d: int, stages: int = 0) -> str:
    """One variant compiled, through descriptors or by pointers (``stages``: that many pipeline stages, else the
    shipped ones)."""
    t = tiles(kernel, d, d, bias=bool(flags["HAS_BIAS"]), block=report.BLOCK, codes=report.CODES)
    t = dataclasses.replace(t, num_stages=stages or t.num_stages)
    fn = getattr(kernels(interpret=False), f"{kernel}_kernel")
    const = {
        "BM": t.bm,
        "BN": t.bn,
        "DK": d,
        "BDV": t.bdv,
        "DOT": tl.bfloat16,
        "PREC": "tf32",
        **flags,
        "TMA": tma,
    }
    const = {k: v for k, v in const.items() if k in fn.arg_names}
    pointers = {name: "*" + ("bf16" if kind == "T" else kind) for name, kind in report.POINTERS.items()}
    if tma:
        cols = {"k_desc": d, "c_desc": d, "v_desc": t.bdv, "mu_desc": t.bdv}
        pointers |= {name: f"tensordesc<bf16[{t.bn}, {cols[name]}]>" for name in report.DESCRIPTORS}
    else:
        const |= dict.fromkeys(report.DESCRIPTORS)
    c = report._compile(fn, pointers, const, report.DIVISIBLE, t)
    row = report._row(kernel, d, d, "bf16", t, c)  # ptxas -v: registers, spills
    shipped = " (shipped)" if tma == (t.tma and bool(flags.get("WHOLE"))) and not stages else ""
    bodies = loops(sass(c.asm["cubin"]))
    sizes = [sum(body.values()) for body in bodies]
    per_item = f"; {key_tiles.item_work(kernel, t, sizes)}" if len(sizes) == 4 else ""
    if d != 128:  # item_work's issue cycles per tensor-core cycle count d 128's multiply-adds
        per_item = per_item.split(",")[0]
    whole = f"\n    whole loop by opcode: {dict(bodies[1].most_common(12))}" if len(sizes) == 4 else ""
    return (f"{t.bm}x{t.bn}x{t.bdv} w{t.num_warps} s{t.num_stages} {'descriptors' if tma else 'pointers   '}{shipped}: "
            f"regs {row.registers} spills {row.spill_bytes} B smem {row.shared_bytes} B; loops {sizes}{per_item}{whole}")  # fmt: skip


@triton.jit
def _attention_loop(q_ptr, k_desc, v_desc, o_ptr, n_keys, BM: tl.constexpr, BN: tl.constexpr, D: tl.constexpr,
                    WS: tl.constexpr):  # fmt: skip
    """A FlashAttention forward loop over tensor-descriptor tiles, ``warp_specialize=WS``: the probe."""
    r = tl.program_id(0) * BM + tl.arange(0, BM)
    d = tl.arange(0, D)
    q = tl.load(q_ptr + r[:, None] * D + d[None, :])
    m_i = tl.full([BM], float("-inf"), tl.float32)
    l_i = tl.full([BM], 0.0, tl.float32)
    acc = tl.full([BM, D], 0.0, tl.float32)
    for t in tl.range(0, n_keys // BN, warp_specialize=WS):
        s = tl.dot(q, tl.trans(k_desc.load([t * BN, 0])))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.bfloat16), v_desc.load([t * BN, 0]))
        m_i = m_new
    tl.store(o_ptr + r[:, None] * D + d[None, :], (acc / l_i[:, None]).to(tl.bfloat16))


def warp_specialised(ws: bool, warps: int) -> str:
    desc = "tensordesc<bf16[128, 128]>"
    signature = {"q_ptr": "*bf16", "k_desc": desc, "v_desc": desc, "o_ptr": "*bf16", "n_keys": "i32",
                 "BM": "constexpr", "BN": "constexpr", "D": "constexpr", "WS": "constexpr"}  # fmt: skip
    src = ASTSource(_attention_loop, signature, constexprs={"BM": 128, "BN": 128, "D": 128, "WS": ws},
                    attrs={(0,): [["tt.divisibility", 16]], (3,): [["tt.divisibility", 16]]})  # fmt: skip
    try:
        c = triton.compile(
            src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": 2}
        )
    except Exception as err:  # noqa: BLE001 - the probe records a failure to compile
        return f"warp_specialize={ws} w{warps}: fails to compile ({type(err).__name__})"
    text = sass(c.asm["cubin"])
    ops = collections.Counter(re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9]*)", text))
    sizes = [sum(body.values()) for body in loops(text)]
    regs = report._row("probe", 128, 128, "bf16", Tiles(128, 128, 128, warps), c).registers
    return (
        f"warp_specialize={ws} w{warps}: regs {regs}, loops {sizes}, setmaxnreg (USETMAXREG) {ops['USETMAXREG']}, "
        f"SASS instructions {sum(ops.values())}"
    )


def main() -> None:
    print(f"Triton {triton.__version__}, sm_90a, bf16, S = L = 512")
    for d in (128, 64):
        print(f"d_k = d_v = {d}")
        for kernel, name, flags in report.variants(d, d, False):
            if kernel in ("forward", "dq"):
                for tma in (True, False):
                    print(f"{kernel:7s} {name:11s} {fused(kernel, flags, tma, d)}", flush=True)
    print("A third stage through descriptors, d 128 (the tile search's candidates):")
    for kernel, name, flags in report.variants(128, 128, False):
        if kernel in ("forward", "dq") and flags["WHOLE"]:
            print(f"{kernel:7s} {name:11s} {fused(kernel, flags, True, 128, stages=3)}", flush=True)
    print(
        "Automatic warp specialisation of a FlashAttention loop (128 x 128 tiles through descriptors, 2 stages):"
    )
    for ws, warps in ((False, 8), (True, 8), (True, 4)):
        print("  " + warp_specialised(ws, warps), flush=True)


if __name__ == "__main__":
    main()
