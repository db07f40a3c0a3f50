#!/bin/bash
# device call 1 (issue 40): make bench-gpu's command on the KJV Bible, then the fused kernels' tile search at 32k in
# what is left of the call's 540 s
export PYTHONPATH=$PWD/.gpu/site:$PWD TVQ_DATA_DIR=$PWD/.gpu/data PYTHONUNBUFFERED=1
t0=$SECONDS
( nvidia-smi -L; nproc; python3 -c "import torch,triton,lightning,hydra;print('torch',torch.__version__,'triton',triton.__version__,'lightning',lightning.__version__,'hydra',hydra.__version__)" ) > $OUT/env.txt 2>&1
cat $OUT/env.txt
timeout 480 python3 -m tvq_exp.tools.bench.gpu --out $OUT/gpu.json --data kjv 2>&1 | tee $OUT/bench.log
echo "bench-gpu rc=${PIPESTATUS[0]} $((SECONDS-t0)) s"
python3 - <<'PY'
import json, os
d = json.load(open(os.environ["OUT"] + "/gpu.json"))
a = d.get("attention", {})
print("mm", a.get("mm_tflops"))
for r in a.get("records", []):
    print({k: r.get(k) for k in ("kernel", "seq_len", "mode", "ms", "tflops_per_s", "flash_time_ratio", "error") if k in r})
t = d.get("training", {})
print({k: v for k, v in t.items() if k not in ("command", "profile", "rows")})
print(json.dumps(d.get("tests"))[:1500])
PY
left=$((525 - (SECONDS - t0)))
if [ $left -gt 60 ]; then
  timeout $left python3 -m tvq_exp.attention.vq.fused.tune --out $OUT/tune.json --lengths 32768 --budget $((left - 15)) > $OUT/tune.log 2>&1
  echo "tune rc=$? $((SECONDS-t0)) s"; tail -40 $OUT/tune.log
fi
