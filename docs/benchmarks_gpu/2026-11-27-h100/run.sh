#!/bin/bash
# device call 1 (one H100, 540 s limit): make bench-gpu (attention, the compiled paper-size training step with the
# fused kernel, the CUDA tests), then the fused kernel's block-size search (python -m tvq_exp.attention.vq.fused.tune)
# in the time left. Hydra/OmegaConf and the KJV Bible travel in .gpu/ (the machine's image has neither).
export PYTHONPATH=$PWD/.gpu/site:$PWD TVQ_DATA_DIR=$PWD/.gpu/data PYTHONUNBUFFERED=1
t0=$SECONDS
( nvidia-smi -L; nproc; python3 -c "import torch,triton,lightning,hydra;print('torch',torch.__version__,'triton',triton.__version__,'lightning',lightning.__version__,'hydra',hydra.__version__)" ) > $OUT/env.txt 2>&1
cat $OUT/env.txt
timeout 400 python3 -m tvq_exp.tools.bench.gpu --out $OUT/gpu.json --data kjv --budgets 130,160,90 \
  --train-seconds 70 --compile-seconds 80 2>&1 | tee $OUT/bench.log | grep -v "^$" | tail -5
echo "bench-gpu rc=${PIPESTATUS[0]} at $((SECONDS-t0)) s"
left=$((515 - (SECONDS-t0)))
timeout $left python3 -m tvq_exp.attention.vq.fused.tune --out $OUT/tune.json --budget $((left - 25)) > $OUT/tune.log 2>&1
echo "tune rc=$? at $((SECONDS-t0)) s"
python3 - <<'PY'
import json, os
d = json.load(open(os.environ["OUT"] + "/gpu.json"))
for r in d.get("attention", {}).get("records", []):
    print(r.get("kernel"), r.get("seq_len"), r.get("mode"), r.get("ms"), r.get("tflops_per_s"), r.get("flash_time_ratio"), r.get("error", ""))
print("mm", d.get("attention", {}).get("mm_tflops"))
print("training", {k: v for k, v in d.get("training", {}).items() if k != "command"})
print("tests", d.get("tests"))
PY
grep -v "^TUNE" $OUT/tune.log | tail -40
