#!/bin/bash
# device call 1 (issue 40), 2026-11-30: make bench-gpu's attention section (every kernel) and the paper-size step, then
# the same step from CUDA graphs (+module.compile_mode=reduce-overhead), then the CUDA-graph test, within 450 s
export PYTHONPATH=$PWD/.gpu/site:$PWD TVQ_DATA_DIR=$PWD/.gpu/data PYTHONUNBUFFERED=1
t0=$SECONDS
( nvidia-smi -L; python3 -c "import torch,triton;print('torch',torch.__version__,'triton',triton.__version__)" ) > $OUT/env.txt 2>&1
cat $OUT/env.txt
timeout 270 python3 -m tvq_exp.tools.bench.gpu --out $OUT/gpu.json --data kjv --skip tests --budgets 130,130,1 \
  --train-seconds 50 --compile-seconds 60 > $OUT/bench.log 2>&1
echo "bench-gpu rc=$? $((SECONDS-t0)) s"
timeout 150 python3 -m tvq_exp.tools.bench.gpu --out $OUT/gpu_graphs.json --data kjv --skip attention,tests \
  --budgets 1,140,1 --train-seconds 50 --compile-seconds 80 --train-overrides +module.compile_mode=reduce-overhead \
  > $OUT/bench_graphs.log 2>&1
echo "bench-gpu graphs rc=$? $((SECONDS-t0)) s"
left=$((440 - (SECONDS - t0)))
if [ $left -gt 20 ]; then
  timeout $left python3 -m pytest -q -n 0 -p no:cacheprovider -k "cuda_graphs or cuda" tests/models/test_compile.py \
    tests/attention/test_vq_cache_triton.py > $OUT/tests.log 2>&1
  echo "tests rc=$? $((SECONDS-t0)) s"; tail -6 $OUT/tests.log
fi
python3 - <<'PY'
import json, os
for name in ("gpu.json", "gpu_graphs.json"):
    path = os.path.join(os.environ["OUT"], name)
    if not os.path.exists(path):
        print(name, "missing"); continue
    d = json.load(open(path))
    a = d.get("attention", {})
    if a: print("mm", a.get("mm_tflops"))
    for r in a.get("records", []):
        print({k: r.get(k) for k in ("kernel", "seq_len", "mode", "ms", "tflops_per_s", "flash_time_ratio", "error")})
    t = d.get("training", {})
    print(name, {k: v for k, v in t.items() if k not in ("command", "profile", "rows")})
PY
