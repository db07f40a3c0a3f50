"""Compile the block sums' tile candidates for sm_90a (the venv's Triton, or PYTHONPATH=.triton/3.6.0)."""
import triton
from tvq_exp.attention.vq.fused import prefix, tune
from tvq_exp.attention.vq.fused.report import compile_prefix, table
shipped = prefix.GPU_TILES["sums"]
rows = []
for c in (shipped, *tune.SUMS_CANDIDATES):
    prefix.GPU_TILES["sums"] = c
    rows.append(compile_prefix("sums", "bf16"))
prefix.GPU_TILES["sums"] = shipped
print("Triton", triton.__version__)
print(table(rows))
