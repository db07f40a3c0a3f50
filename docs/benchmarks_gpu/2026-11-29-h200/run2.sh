#!/bin/bash
# device call 2 (issue 40), after the cache's means were split into block sums + walks (forward) and suffix walk +
# code rows (backward): the attention section for SDPA flash and VQ's fused layer (eager, compiled), the paper-size
# training step, then the CUDA tests of the means and of the fused kernels in what is left of 300 s
export PYTHONPATH=$PWD/.gpu/site:$PWD TVQ_DATA_DIR=$PWD/.gpu/data PYTHONUNBUFFERED=1
t0=$SECONDS
timeout 225 python3 -m tvq_exp.tools.bench.gpu --out $OUT/gpu.json --data kjv --kernels sdpa_flash,vq_triton,vq_triton_compiled \
  --budgets 75,135,1 --skip tests --train-seconds 60 --compile-seconds 60 > $OUT/bench.log 2>&1
echo "bench-gpu rc=$? $((SECONDS-t0)) s"
left=$((300 - (SECONDS - t0)))
timeout $left python3 -m pytest -q -n 0 -p no:cacheprovider -k cuda tests/attention/test_vq_cache_triton.py \
  tests/attention/test_vq_triton_compile.py tests/attention/test_vq_triton_cuda.py > $OUT/tests.log 2>&1
echo "tests rc=$? $((SECONDS-t0)) s"; tail -4 $OUT/tests.log
python3 - <<'PY'
import json, os
d = json.load(open(os.environ["OUT"] + "/gpu.json"))
a = d.get("attention", {})
for r in a.get("records", []):
    print({k: r.get(k) for k in ("kernel", "seq_len", "mode", "ms", "tflops_per_s", "flash_time_ratio", "error")})
    p = r.get("profile")
    if p: print(json.dumps(p)[:1500])
t = d.get("training", {})
print({k: v for k, v in t.items() if k not in ("command", "profile", "rows")})
PY
