#!/bin/bash
# device call (one H100, 540 s limit), the second session's: the GPU check's attention section (SDPA flash, VQ fused
# eager and under torch.compile) and the paper-size training step compiled by blocks (module.compile_scope=blocks,
# the enwik8_paper preset's), then the fused layer's device profile at 32k (python -m tvq_exp.attention.vq.fused.tune
# with no tile search). Hydra/OmegaConf and the KJV Bible travel in .gpu/ (the machine's image has neither).
export PYTHONPATH=$PWD/.gpu/site:$PWD TVQ_DATA_DIR=$PWD/.gpu/data PYTHONUNBUFFERED=1
t0=$SECONDS
( nvidia-smi -L; nproc; python3 -c "import torch,triton,lightning,hydra;print('torch',torch.__version__,'triton',triton.__version__,'lightning',lightning.__version__,'hydra',hydra.__version__)" ) > $OUT/env.txt 2>&1
cat $OUT/env.txt
timeout 440 python3 -m tvq_exp.tools.bench.gpu --out $OUT/gpu.json --data kjv --skip tests \
  --kernels sdpa_flash,vq_triton,vq_triton_compiled --budgets 150,270,0 \
  --train-seconds 60 --compile-seconds 180 --batch-sizes 8,4 2>&1 | tee $OUT/bench.log | grep -v "^$" | tail -5
echo "bench-gpu rc=${PIPESTATUS[0]} at $((SECONDS-t0)) s"
left=$((520 - (SECONDS-t0)))
if [ $left -gt 30 ]; then
  timeout $left python3 -m tvq_exp.attention.vq.fused.tune --out $OUT/tune.json --kernels none --lengths 32768 \
    --budget $((left - 20)) > $OUT/tune.log 2>&1
  echo "tune rc=$? at $((SECONDS-t0)) s"
fi
python3 - <<'PY'
import json, os
d = json.load(open(os.environ["OUT"] + "/gpu.json"))
for r in d.get("attention", {}).get("records", []):
    print(r.get("kernel"), r.get("seq_len"), r.get("mode"), r.get("ms"), r.get("tflops_per_s"), r.get("flash_time_ratio"), r.get("error", ""))
print("mm", d.get("attention", {}).get("mm_tflops"))
print("training", {k: v for k, v in d.get("training", {}).items() if k != "command"})
PY
grep -v "^TUNE" $OUT/tune.log | tail -12
