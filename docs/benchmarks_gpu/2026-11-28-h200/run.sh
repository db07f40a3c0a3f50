#!/bin/bash
# device call 1 (issue 40): make bench-gpu's command on the KJV Bible (Gutenberg is carried for call 2 only)
export PYTHONPATH=$PWD/.gpu/site:$PWD TVQ_DATA_DIR=$PWD/.gpu/data PYTHONUNBUFFERED=1
t0=$SECONDS
( nvidia-smi -L; nproc; python3 -c "import torch,triton,lightning,hydra;print('torch',torch.__version__,'triton',triton.__version__,'lightning',lightning.__version__,'hydra',hydra.__version__)" ) > $OUT/env.txt 2>&1
cat $OUT/env.txt
timeout 515 python3 -m tvq_exp.tools.bench.gpu --out $OUT/gpu.json --data kjv 2>&1 | tee $OUT/bench.log
echo "bench-gpu rc=${PIPESTATUS[0]} $((SECONDS-t0)) s"
python3 - <<'PY'
import json, os
d = json.load(open(os.environ["OUT"] + "/gpu.json"))
a = d.get("attention", {})
print("mm", a.get("mm_tflops"))
for r in a.get("records", []):
    print({k: r.get(k) for k in ("kernel", "seq_len", "mode", "ms", "tflops_per_s", "flash_time_ratio", "error") if k in r})
t = d.get("training", {})
print({k: v for k, v in t.items() if k not in ("command", "profile")})
p = t.get("profile")
print(json.dumps(p)[:3000] if p else "no profile")
print(d.get("tests"))
PY
