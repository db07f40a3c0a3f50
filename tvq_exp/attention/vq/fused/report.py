"""The sm_90a compile report of the fused kernels: ``python -m tvq_exp.attention.vq.fused.report`` (``make
kernel-report``).

Over 300 lines: one compile (:func:`_compile`, :func:`_row`) shared by the window + cache kernels, their backward's
row term, the code search and the cache means' four kernels, each needing its own pointer types and constants.

Compiles every configuration :mod:`.config` ships (each kernel with the flags that make it largest, at the head
sizes of :data:`~tvq_exp.attention.vq.fused.config.SHIPPED`, bf16 and fp32 operands) for an H100 (sm_90a) with
Triton's bundled ``ptxas``: no GPU nor driver is needed. The first line names the Triton that compiled them:
the venv's, or the one the lent GPUs run (``make kernel-report-device``; their compiler builds the kernels there).
Prints registers, spills, stack, shared memory, whether the matrix products use Hopper's ``wgmma`` and how many
times the most repeated one is computed (:func:`repeats`), one line per configuration; exits 1 when a bf16
configuration spills or repeats a product, or any needs more shared memory than an H100 block may have (fp32
configurations, the GPU's correctness path, do spill: see :attr:`Row.gated`).
"""

from __future__ import annotations

import argparse
import itertools
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tvq_exp.attention.vq.fused.config import H100_SHARED_BYTES, SHIPPED, Tiles, padded_dim, tiles

# the pointer arguments' element types, by name (``T``: the operands' dtype; the cache's means and their gradient
# too, as the op passes them)
POINTERS = {
    "q_ptr": "T", "k_ptr": "T", "v_ptr": "T", "c_ptr": "T", "do_ptr": "T", "out_ptr": "T", "dq_ptr": "T",
    "dk_ptr": "T", "dv_ptr": "T", "dc_ptr": "T", "dl_ptr": "fp32", "ln_ptr": "fp32", "mu_ptr": "T",
    "lse_ptr": "fp32", "delta_ptr": "fp32", "ddl_ptr": "fp32", "dmu_ptr": "T",
}  # fmt: skip
DTYPES = {"bf16": "bf16", "fp32": "fp32"}
# the forward's and dq's tensor descriptors (None where their tiles load by pointers)
DESCRIPTORS = ("k_desc", "v_desc", "c_desc", "mu_desc")
# integer arguments taken as multiples of 16, as Triton specialises them at launch when they are (head and block
# sizes of the shipped shapes; pointers are 16-byte aligned): this is what lets the tile loads be 16-byte vectors
DIVISIBLE = {"dk", "dv", "L", "W", "S", "Lq", "R", "code_seq_stride", "code_item_stride"}
# the row arguments of two layouts, as Triton compiles a launch of each: the kernels' constexprs (HK and the rows'
# steps), the arguments equal to 1 (which Triton specialises as constants) and the strides that are multiples of 16
# (which it specialises as such). Contiguous rows of one sequence axis (the op's layout with the XL bias, one head's);
# and the check's: four heads innermost, one query head a key head ((B, T, H, d) seen as (B, H, T, d), T and Lq
# multiples of 16)
ROWS = {
    "contiguous": (
        {"HK": 1, "sq_p": 1, "sk_t": 1, "sg_t": 1}, ("sq_b", "sq_h", "sq_i", "sq_g", "sk_b", "sk_h", "sg_b", "sg_h")
    ),
    "check": (
        {"HK": 4, "sq_p": 4, "sk_t": 4, "sg_t": 4, "sq_h": 1, "sk_h": 1, "sg_h": 1}, ("sq_b", "sq_i", "sq_g", "sk_b", "sg_b")
    ),
}  # fmt: skip
# the keys per block and the codebook size the configurations are chosen for (the paper's S = L)
BLOCK = CODES = 512
# a Hopper layout (``#mma = #ttg.nvidia_mma<{versionMajor = 3, ... warpsPerCTA = [wm, wn], ... instrShape = [16, n,
# 16]}>``) and a product into one (``ttng.warp_group_dot ... -> tensor<MxNxf32, #mma>``), in Triton's TTGIR
HOPPER_LAYOUT = re.compile(
    r"(#mma\d*) = #ttg\.nvidia_mma<\{versionMajor = 3,[^}]*warpsPerCTA = \[(\d+), (\d+)\][^}]*"
    r"instrShape = \[\d+, (\d+), \d+\]"
)
HOPPER_PRODUCT = re.compile(r"warp_group_dot [^\n]*-> tensor<(\d+)x(\d+)x\w+, (#mma\d*)>")


@dataclass(frozen=True)
class Row:
    """One compiled configuration and what ``ptxas`` reports for it."""

    kernel: str
    flags: str
    d_k: int
    d_v: int
    dtype: str
    tiles: Tiles
    registers: int
    spill_bytes: int
    stack_bytes: int
    shared_bytes: int
    wgmma: bool
    repeats: int = 1

    @property
    def gated(self) -> bool:
        """Whether spills and repeated products fail the report: bf16 (the path trained and benchmarked), the
        nearest-code search (fp32 only, and on every path), the running code means, the row term and the quantiser's
        pass over its keys (every dtype). fp32 operands
        of the attention kernels (three tf32 products per dot) are the GPU's correctness path: their spills and
        repeats are reported, not refused."""
        return (
            self.dtype != "fp32"
            or self.kernel in ("nearest", "row term")
            or self.kernel.startswith(("means", "quantiser"))
        )

    @property
    def ok(self) -> bool:
        wasted = self.spill_bytes > 0 or self.repeats > 1
        return not (wasted and self.gated) and self.shared_bytes <= H100_SHARED_BYTES


def repeats(ttgir: str) -> int:
    """How many times the most repeated Hopper product of a compiled kernel (its TTGIR) is computed: 1 when every
    warp computes its own part of each product.

    A layout of ``wm × wn`` warps covers ``16·wm`` rows (a warpgroup, four warps, takes 64) and ``wn·n`` columns.
    A product whose tile is smaller (64 rows on 8 warps along the rows: Triton lays a score tile that feeds the
    next product out with all warps along its rows) is computed whole by each warpgroup the tile does not reach:
    the same scores and their softmax twice, for one result."""
    layouts = {m[1]: (int(m[2]), int(m[3]), int(m[4])) for m in HOPPER_LAYOUT.finditer(ttgir)}
    worst = 1
    for m in HOPPER_PRODUCT.finditer(ttgir):
        rows, cols = int(m[1]), int(m[2])
        wm, wn, n = layouts[m[3]]
        worst = max(worst, max(1, 16 * wm // rows) * max(1, wn * n // cols))
    return worst


def variants(d_k: int, d_v: int, fp32: bool) -> list[tuple[str, str, dict[str, object]]]:
    """``(kernel, flags, constexprs)`` of every launch the op makes at these heads, with the largest flags: with the
    XL bias, and without it, where whole tiles take loops of their own (``WHOLE``); every loop loads without masks
    (``EVEN``: the shipped heads, ``S = L = 512`` and whole blocks of queries fill every tile)."""
    out: list[tuple[str, str, dict[str, object]]] = []
    for bias in (
        True,
        False,
    ):  # with the bias, or without it and whole tiles unmasked (other forward tiles too)
        name = "cache+bias" if bias else "cache+whole"
        out.append(("forward", name, {"HAS_CACHE": True, "HAS_BIAS": bias, "WHOLE": not bias, "EVEN": True}))
        one = tiles("dq", d_k, d_v, fp32=fp32).bdv >= d_v
        dq = {"HAS_CACHE": True, "HAS_BIAS": bias, "BIAS_GRAD": bias, "ONE_CHUNK": one, "WHOLE": not bias,
              "EVEN": True}  # fmt: skip
        out.append(("dq", name, dq))
    for kernel in ("window_key", "code"):
        one = tiles(kernel, d_k, d_v, fp32=fp32).bdv >= d_v
        passes = [(True, True)] if one else [(False, True), (True, False)]
        for (dk_, dv_), bias in itertools.product(
            passes, (True, False) if kernel == "window_key" else (True,)
        ):
            flags = "+".join(name for name, on in (("dk", dk_), ("dv", dv_)) if on)
            flags += ("+bias" if bias else "+whole") * (kernel == "window_key")
            const = {
                "ONE_CHUNK": one,
                "DO_DK": dk_,
                "DO_DV": dv_,
                "HAS_BIAS": bias,
                "WHOLE": not bias,
                "EVEN": True,
            }
            out.append((kernel, flags, const))
    return out


def compile_one(
    kernel: str, flags: dict[str, object], d_k: int, d_v: int, dtype: str, layout: str | None = None
) -> Row:
    """Compile one configuration for sm_90a and read ``ptxas -v``: its rows in ``layout`` (:data:`ROWS`; by default
    contiguous with the XL bias, which the op makes so, else the check's)."""
    from tvq_exp.attention.vq.fused.support import kernels

    fn = getattr(
        kernels(interpret=False), f"{kernel}_kernel"
    )  # first: it imports Triton in the compiled mode
    import triton.language as tl

    bias = bool(flags.get("HAS_BIAS")) and kernel != "code"
    layout = layout or ("contiguous" if bias else "check")
    t = tiles(
        kernel, d_k, d_v, fp32=dtype == "fp32", bias=bias, block=BLOCK, codes=CODES, strided=layout == "check"
    )
    dot = tl.float32 if dtype == "fp32" else tl.bfloat16
    tma = t.tma and bool(flags.get("WHOLE")) and bool(flags.get("EVEN"))  # as the op's descriptors
    const = {"BM": t.bm, "BN": t.bn, "DK": padded_dim(d_k), "BDV": t.bdv, "DOT": dot,
             "PREC": "tf32x3" if dtype == "fp32" else "tf32", "TMA": tma, **flags}  # fmt: skip
    fixed, aligned = ROWS[layout]
    const |= fixed
    divisible = DIVISIBLE | set(aligned)
    const = {k: v for k, v in const.items() if k in fn.arg_names}
    pointers = {name: "*" + (DTYPES[dtype] if kind == "T" else kind) for name, kind in POINTERS.items()}
    descriptors = [name for name in DESCRIPTORS if name in fn.arg_names]
    if tma:  # the tiles' rows: keys and codes DK wide, values and means BDV
        cols = {"k_desc": padded_dim(d_k), "c_desc": padded_dim(d_k), "v_desc": t.bdv, "mu_desc": t.bdv}
        pointers |= {name: f"tensordesc<{DTYPES[dtype]}[{t.bn}, {cols[name]}]>" for name in descriptors}
    else:
        const |= dict.fromkeys(descriptors)
    compiled = _compile(fn, pointers, const, divisible, t)
    return _row(kernel, d_k, d_v, dtype, t, compiled)


def _compile(
    fn: object, pointers: dict[str, str], const: dict[str, object], divisible: set[str], t: Tiles
) -> object:
    """Compile a Triton kernel for sm_90a: ``pointers`` its pointer (and tensor-descriptor) arguments' types,
    ``const`` its constexprs, the other arguments i32 (``divisible`` ones multiples of 16)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = fn.arg_names
    missing = [p.name for p in fn.params if p.is_constexpr and p.name not in const]
    if missing:  # it would compile them as i32 arguments: another kernel than any launch runs
        raise ValueError(f"{fn.__name__}: no value for its constexprs {missing}")
    signature = {name: "constexpr" if name in const else pointers.get(name, "i32") for name in names}
    attrs = {
        (i,): [["tt.divisibility", 16]]
        for i, name in enumerate(names)
        if pointers.get(name, "").startswith("*") or name in divisible
    }
    src = ASTSource(fn, signature, constexprs=const, attrs=attrs)
    with triton.knobs.runtime.scope():
        triton.knobs.runtime.interpret = False
        return triton.compile(
            src,
            target=GPUTarget("cuda", 90, 32),
            options={"num_warps": t.num_warps, "num_stages": t.num_stages},
        )


def compile_nearest(d_k: int, dtype: str, t: Tiles | None = None) -> Row:
    """Compile the nearest-code search (:mod:`tvq_exp.quantize.fused_nearest`, keys ``dtype``, its shipped tiles or
    ``t``) for sm_90a."""
    import torch

    import tvq_exp.quantize.fused_nearest as nearest

    fn = nearest.nearest_kernels(False)
    keys = torch.bfloat16 if dtype == "bf16" else torch.float32
    t = t or Tiles(*nearest.TILES[keys][:2], 0, *nearest.TILES[keys][2:])
    const = {"BM": t.bm, "BS": t.bn, "DK": padded_dim(d_k), "PIECES": nearest.PIECES[keys],
             "DOT": nearest.dot_dtype(keys, False), "PREC": "tf32x3"}  # fmt: skip
    pointers = {"x_ptr": f"*{dtype}", "c_ptr": f"*{dtype}", "c2_ptr": "*fp32", "out_ptr": "*i64"}
    compiled = _compile(fn.nearest_kernel, pointers, const, {"S", "D", "stride_xh", "stride_xn"}, t)
    return _row("nearest", d_k, 0, dtype, t, compiled)


def compile_statistics(kernel: str, d_k: int, dtype: str) -> Row:
    """Compile one of the quantiser's pass over its keys (:mod:`tvq_exp.quantize.fused_statistics`: ``statistics``
    with the key sums, or ``error_grad``; keys ``dtype``, its GPU rows) for sm_90a. The row's ``BM``: keys a program."""
    from tvq_exp.quantize import fused_statistics as statistics

    fn = getattr(statistics.statistics_kernels(False), f"{kernel}_kernel")
    t = Tiles(statistics.ROWS[False], 0, 0, num_warps=4)
    const: dict[str, object] = {"BM": t.bm, "DK": padded_dim(d_k)} | (
        {"SUMS": True} if kernel == "statistics" else {}
    )
    pointers = {"x_ptr": f"*{dtype}", "codes_ptr": "*i64", "c_ptr": "*fp32", "cx_ptr": f"*{dtype}",
                "rows_ptr": f"*{dtype}", "dx_ptr": f"*{dtype}", "g_ptr": "*fp32", "moments_ptr": "*fp32",
                "counts_ptr": "*fp32", "sums_ptr": "*fp32"}  # fmt: skip
    divisible = {"D", "sx_b", "sx_h", "sx_t", "sr_b", "sr_h", "sr_t", "sd_b", "sd_h", "sd_t"}
    return _row(f"quantiser {kernel}", d_k, 0, dtype, t, _compile(fn, pointers, const, divisible, t))


def compile_pieces(d_k: int, dtype: str) -> Row:
    """Compile the search's codebook pieces (:func:`tvq_exp.quantize.fused_nearest.launch_pieces`; pieces ``dtype``:
    three bf16 ones, or fp32 scaled codes) for sm_90a. The row's ``BM``: codebook rows a program."""
    import torch

    import tvq_exp.quantize.fused_nearest as nearest

    keys = torch.bfloat16 if dtype == "bf16" else torch.float32
    t = Tiles(nearest.PIECE_ROWS, 0, 0, num_warps=4)
    const = {"BR": t.bm, "DK": padded_dim(d_k), "PIECES": nearest.PIECES[keys]}
    pointers = {"c_ptr": "*fp32", "c2_ptr": "*fp32", "pieces_ptr": f"*{dtype}"}
    compiled = _compile(nearest.nearest_kernels(False).pieces_kernel, pointers, const, {"D"}, t)
    return _row("search pieces", d_k, 0, dtype, t, compiled)


def compile_metrics() -> Row:
    """Compile the quantiser's metrics (:func:`tvq_exp.quantize.fused_statistics.fused_metrics`, one program) for
    sm_90a. The row's ``BM``: codes a step."""
    from tvq_exp.quantize import fused_statistics as statistics

    t = Tiles(statistics.METRICS_CODES, 0, 0, num_warps=4)
    pointers = {"counts_ptr": "*fp32", "sq_error_ptr": "*fp32", "sq_norm_ptr": "*fp32", "out_ptr": "*fp32",
                "share": "fp32"}  # fmt: skip
    compiled = _compile(statistics.statistics_kernels(False).metrics_kernel, pointers, {"BS": t.bm}, set(), t)
    return _row("quantiser metrics", 0, 0, "fp32", t, compiled)


def compile_row_term(dtype: str) -> Row:
    """Compile the backward's row term (``delta_kernel``: ``Σ dO·O`` per row, :data:`.op.DELTA_TILES`) for sm_90a."""
    from tvq_exp.attention.vq.fused.op import DELTA_TILES
    from tvq_exp.attention.vq.fused.support import kernels

    rows, columns = DELTA_TILES[False]
    t = Tiles(rows, 0, columns)
    pointers = {"do_ptr": f"*{dtype}", "o_ptr": f"*{dtype}", "delta_ptr": "*fp32"}
    fn = kernels(interpret=False).delta_kernel
    return _row("row term", 0, 0, dtype, t, _compile(fn, pointers, {"BM": rows, "BD": columns}, {"D"}, t))


def compile_prefix(kernel: str, dtype: str) -> Row:
    """Compile one of the running code means' kernels (:mod:`.prefix`: ``sums``, ``forward``, ``backward`` or
    ``rows``, values ``dtype``, its GPU tiles) for sm_90a. The row's ``BM×BN×BDV``: codes × positions a step ×
    columns (the block sums), codes × 0 × columns (the walks), positions × 0 × columns (the code rows)."""
    import triton.language as tl

    from tvq_exp.attention.vq.fused import prefix

    kernels = prefix.prefix_kernels(False)
    tiles = prefix.GPU_TILES[kernel]
    codes = {"z_ptr": "*i32"}
    if kernel == "sums":
        fn, (bs, bt, bd, warps, stages) = kernels.block_sums_kernel, tiles
        const: dict[str, object] = {
            "BS": bs, "BT": bt, "BD": bd, "BC": prefix.RUN_STEP[False], "DOT": tl.bfloat16 if dtype == "bf16" else tl.float32,
            "PREC": "tf32" if dtype == "bf16" else "tf32x3",
        }  # fmt: skip
        pointers = {
            "zs_ptr": "*i32",
            "order_ptr": "*i64",
            "v_ptr": f"*{dtype}",
            "sums_ptr": "*fp32",
            "cnt_ptr": "*fp32",
        }
        t = Tiles(bs, bt, bd, num_warps=warps, num_stages=stages)
    elif kernel == "rows":
        fn, (bt, bd, warps, stages) = kernels.code_rows_kernel, tiles
        const, pointers = {"BT": bt, "BD": bd}, codes | {"suffix_ptr": f"*{dtype}", "dv_ptr": f"*{dtype}"}
        t = Tiles(bt, 0, bd, num_warps=warps, num_stages=stages)
    else:
        bs, bd, warps, stages = tiles
        const, t = {"BS": bs, "BD": bd}, Tiles(bs, 0, bd, num_warps=warps, num_stages=stages)
        if kernel == "forward":
            fn = kernels.prefix_forward_kernel
            pointers = {"sums_ptr": "*fp32", "cnt_ptr": "*fp32", "n0_ptr": "*fp64", "mu0_ptr": "*fp32",
                        "n_ptr": "*fp64", "items_ptr": f"*{dtype}", "state_ptr": "*fp32"}  # fmt: skip
        else:
            fn = kernels.prefix_backward_kernel
            pointers = {"g_ptr": f"*{dtype}", "n_ptr": "*fp64", "suffix_ptr": f"*{dtype}"}
    return _row(f"means {kernel}", 0, 0, dtype, t, _compile(fn, pointers, const, {"L", "S", "D"}, t))


def _row(kernel: str, d_k: int, d_v: int, dtype: str, t: Tiles, compiled: object) -> Row:
    """What ``ptxas -v`` reports for a Triton-compiled kernel, as a :class:`Row`."""
    from triton.backends.nvidia.compiler import get_ptxas

    ptx = compiled.asm["ptx"]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.ptx"
        path.write_text(ptx)
        log = subprocess.run(
            [get_ptxas(90).path, "-v", "--gpu-name", "sm_90a", str(path), "-o", str(Path(tmp) / "k.cubin")],
            capture_output=True, text=True, check=True,
        ).stderr  # fmt: skip
    regs = int(re.search(r"Used (\d+) registers", log).group(1))
    spills = sum(int(x) for x in re.findall(r"(\d+) bytes spill (?:stores|loads)", log))
    stack = int(re.search(r"(\d+) bytes stack frame", log).group(1))
    found = (regs, spills, stack, compiled.metadata.shared, "wgmma" in ptx, repeats(compiled.asm["ttgir"]))
    return Row(kernel, "", d_k, d_v, dtype, t, *found)


def report(
    heads: tuple[tuple[int, int], ...] = SHIPPED, dtypes: tuple[str, ...] = ("bf16", "fp32")
) -> list[Row]:
    """Every shipped configuration, compiled; then the nearest-code search at each shipped ``d_k``, the cache means'
    kernels, the row term and the quantiser's pass over its keys at each shipped ``d_k``."""
    rows = []
    for (d_k, d_v), dtype in itertools.product(heads, dtypes):
        for kernel, flags, const in variants(d_k, d_v, dtype == "fp32"):
            # with the bias the op's rows are contiguous; without it, the check's four heads apart or one head's
            bias = const.get("HAS_BIAS") and kernel != "code"
            for layout in ("contiguous",) if bias else ("check", "contiguous"):
                row = compile_one(kernel, const, d_k, d_v, dtype, layout)
                rows.append(
                    Row(**{**row.__dict__, "flags": flags + ("+4 heads" if layout == "check" else "")})
                )
    d_ks = sorted({d_k for d_k, _ in heads}, reverse=True)
    rows += [compile_nearest(d_k, dtype) for d_k in d_ks for dtype in dtypes]
    from tvq_exp.attention.vq.fused.prefix import GPU_TILES

    rows += [compile_prefix(kernel, dtype) for kernel in GPU_TILES for dtype in dtypes]
    rows += [compile_row_term(dtype) for dtype in dtypes]
    kernels = ("statistics", "error_grad")
    rows += [compile_statistics(k, d_k, dtype) for k in kernels for d_k in d_ks for dtype in dtypes]
    rows += [compile_pieces(d_k, dtype) for d_k in d_ks for dtype in dtypes]
    return rows + [compile_metrics()]


def table(rows: list[Row]) -> str:
    """The report as a Markdown table."""
    lines = [
        "| kernel | flags | d_k | d_v | dtype | BM×BN×BDV | warps | stages | regs | spills (B) | stack (B) "
        "| smem (B) | wgmma | repeats | gated | ok |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        t = r.tiles
        lines.append(
            f"| {r.kernel} | {r.flags} | {r.d_k} | {r.d_v} | {r.dtype} | {t.bm}×{t.bn}×{t.bdv} | {t.num_warps} "
            f"| {t.num_stages} | {r.registers} | {r.spill_bytes} | {r.stack_bytes} | {r.shared_bytes} "
            f"| {'yes' if r.wgmma else 'no'} | {r.repeats} | {'yes' if r.gated else 'no'} | {'yes' if r.ok else 'NO'} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", default="bf16,fp32", help="operand dtypes, comma-separated (bf16, fp32)")
    args = parser.parse_args(argv)
    rows = report(dtypes=tuple(args.dtypes.split(",")))
    import triton  # after the kernels: the version that compiled them (make kernel-report-device: another one)

    print(f"Triton {triton.__version__}, sm_90a\n")
    print(table(rows))
    bad = [r for r in rows if not r.ok]
    if bad:
        print(f"{len(bad)} failed: bf16 spills or repeated products, or over {H100_SHARED_BYTES} B of smem")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
