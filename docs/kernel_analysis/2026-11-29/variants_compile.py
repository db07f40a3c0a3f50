"""Every launch variant of the four fused kernels compiles for sm_90a under the Triton first on the path: each
combination of the flags the op sets (the cache, the XL bias and its gradient, whole tiles, unmasked loads, one or
several value chunks, which gradients a pass computes), bf16, at d_k 128 with d_v 128 (one chunk) and 256 (two).
``make kernel-report`` compiles only each kernel's largest variants with unmasked loads; the CUDA tests on a lent GPU
launch the others (ragged lengths: masked loads; no cache; no bias) with the GPU's Triton. Run it as
``tile_spills.py`` (its docstring), once per Triton; logs ``variants_compile_3.8.log``, ``variants_compile_3.6.log``.
Prints one line per variant that fails or spills, then the counts."""

from __future__ import annotations

import itertools

import triton

from tvq_exp.attention.vq.fused import report
from tvq_exp.attention.vq.fused.config import tiles


def flag_sets(kernel: str, one: bool) -> list[dict[str, bool]]:
    """The flag combinations the op can launch ``kernel`` with (``one``: the values fit one chunk)."""
    out = []
    for bias, even in itertools.product((True, False), (True, False)):
        wholes = (False,) if bias else (True, False)
        for whole in wholes:
            if kernel == "forward":
                out += [
                    {"HAS_CACHE": c, "HAS_BIAS": bias, "WHOLE": whole, "EVEN": even} for c in (True, False)
                ]
            elif kernel == "dq":
                grads = (True, False) if bias else (False,)
                out += [{"HAS_CACHE": c, "HAS_BIAS": bias, "BIAS_GRAD": g, "ONE_CHUNK": one, "WHOLE": whole,
                         "EVEN": even} for c in (True, False) for g in grads]  # fmt: skip
            else:
                passes = [(True, True)] if one else [(False, True), (True, False)]
                flags = [{"ONE_CHUNK": one, "DO_DK": dk, "DO_DV": dv, "EVEN": even} for dk, dv in passes]
                if kernel == "window_key":
                    out += [f | {"HAS_BIAS": bias, "WHOLE": whole} for f in flags]
                elif bias and whole is False:  # the codes' kernel takes no bias flags: once per pass and EVEN
                    out += flags
    return out


def main() -> None:
    print(f"Triton {triton.__version__}, sm_90a, bf16")
    done = failed = spilled = 0
    for d_v in (128, 256):
        for kernel in ("forward", "dq", "window_key", "code"):
            one = tiles(kernel, 128, d_v).bdv >= d_v
            for flags in flag_sets(kernel, one):
                try:
                    row = report.compile_one(kernel, flags, 128, d_v, "bf16")
                except Exception as err:  # noqa: BLE001 - every failure is printed, the next variant compiles
                    failed += 1
                    print(
                        f"FAILED {kernel} d_v {d_v} {flags}: {type(err).__name__}: {str(err)[:300]}",
                        flush=True,
                    )
                    continue
                done += 1
                if row.spill_bytes:
                    spilled += 1
                    print(f"spills {row.spill_bytes} B: {kernel} d_v {d_v} {flags}", flush=True)
    print(f"{done} compiled, {failed} failed, {spilled} spilled")


if __name__ == "__main__":
    main()
