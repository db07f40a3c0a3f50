#!/bin/bash
# device call (one H100, 330 s limit): the fused nearest-code search's CUDA tests, then the GPU check's attention
# section (SDPA flash, VQ fused eager and compiled) with it, then the VQ layer's device profile at 32k.
export PYTHONPATH=$PWD/.gpu/site:$PWD TVQ_DATA_DIR=$PWD/.gpu/data PYTHONUNBUFFERED=1
t0=$SECONDS
( nvidia-smi -L; python3 -c "import torch,triton;print('torch',torch.__version__,'triton',triton.__version__)" ) > $OUT/env.txt 2>&1
timeout 80 python3 -m pytest -q -p no:cacheprovider -k cuda tests/quantize/test_fused_nearest.py \
  tests/attention/test_vq_triton.py --junitxml=$OUT/junit.xml > $OUT/tests.log 2>&1
echo "tests rc=$? at $((SECONDS-t0)) s: $(tail -1 $OUT/tests.log)"
timeout 170 python3 -m tvq_exp.tools.bench.gpu --out $OUT/gpu.json --skip training,tests \
  --kernels sdpa_flash,vq_triton,vq_triton_compiled --budgets 150,0,0 > $OUT/bench.log 2>&1
echo "bench-gpu rc=$? at $((SECONDS-t0)) s"
left=$((300 - (SECONDS-t0)))
if [ $left -gt 25 ]; then
  timeout $left python3 -m tvq_exp.attention.vq.fused.tune --out $OUT/tune.json --kernels none --lengths 32768 \
    --reps 5 --budget $((left - 15)) > $OUT/tune.log 2>&1
  echo "tune rc=$? at $((SECONDS-t0)) s"
fi
python3 - <<'PY'
import json, os
d = json.load(open(os.environ["OUT"] + "/gpu.json"))
for r in d.get("attention", {}).get("records", []):
    print(r.get("kernel"), r.get("seq_len"), r.get("mode"), r.get("ms"), r.get("tflops_per_s"), r.get("flash_time_ratio"), r.get("error", ""))
PY
grep "^profile" $OUT/tune.log | cut -c1-900
grep -E "FAILED|Error" $OUT/tests.log | head -5
