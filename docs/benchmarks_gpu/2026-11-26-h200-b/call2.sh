#!/bin/bash
# device call 2: make bench-gpu's attention and training sections (the CUDA tests ran in call 1), alone on the GPU
export PYTHONPATH=$PWD/.gpu/site:$PWD TVQ_DATA_DIR=$PWD/.gpu/data PYTHONUNBUFFERED=1
t0=$SECONDS
timeout 400 python3 -m tvq_exp.tools.bench.gpu --out $OUT/gpu.json --data kjv --skip tests --timeout 25 --train-seconds 60
echo "bench-gpu rc=$? $((SECONDS-t0)) s"
python3 -c "
import json; from tvq_exp.tools.bench.report import print_table
d = json.load(open('$OUT/gpu.json')); a = d.get('attention', {})
print_table(a.get('records', [])); print(a.get('error', ''))
print({k: v for k, v in d.get('training', {}).items() if k != 'command'})
"
