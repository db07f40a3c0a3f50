#!/bin/bash
# device call 2 (issue 40), 2026-11-30, after the quantiser's per-key work moved into Triton kernels
# (tvq_exp/quantize/code_error.py): SDPA flash and VQ's fused layer (eager, compiled) at 8k / 32k / 128k and the
# paper-size step; the new kernels' and the CUDA-graph test on the device; then the paper step from CUDA graphs
# with torch's logs, to see why call 1's gave no row in 140 s; within 380 s
export PYTHONPATH=$PWD/.gpu/site:$PWD TVQ_DATA_DIR=$PWD/.gpu/data PYTHONUNBUFFERED=1
t0=$SECONDS
timeout 200 python3 -m tvq_exp.tools.bench.gpu --out $OUT/gpu.json --data kjv --kernels sdpa_flash,vq_triton,vq_triton_compiled \
  --budgets 70,120,1 --skip tests --train-seconds 40 --compile-seconds 60 > $OUT/bench.log 2>&1
echo "bench-gpu rc=$? $((SECONDS-t0)) s"
timeout 70 python3 -m pytest -q -n 0 -p no:cacheprovider -k cuda tests/quantize/test_code_error.py \
  tests/models/test_compile.py > $OUT/tests.log 2>&1
echo "tests rc=$? $((SECONDS-t0)) s"; tail -4 $OUT/tests.log
left=$((375 - (SECONDS - t0)))
if [ $left -gt 30 ]; then
  TORCH_LOGS=perf_hints,recompiles timeout $left python3 train.py experiment=enwik8_paper trainer=gpu trainer.devices=1 \
    global_batch_size=null trainer.check_val_every_n_epoch=null trainer.val_check_interval=1000000 \
    trainer.limit_val_batches=1 trainer.max_steps=40 trainer.log_every_n_steps=2 logger=csv \
    trainer.enable_progress_bar=false ++logger.csv.flush_logs_every_n_steps=2 data=kjv data.batch_size=16 \
    +module.compile_mode=reduce-overhead hydra.run.dir=$OUT/graphs > $OUT/graphs.log 2>&1
  echo "graphs rc=$? $((SECONDS-t0)) s"; grep -v "^\s*$" $OUT/graphs.log | cut -c1-300 | tail -25
  m=$(find $OUT/graphs -name metrics.csv | head -1); [ -n "$m" ] && cp $m $OUT/graphs_metrics.csv && tail -5 $m | cut -c1-400
  rm -rf $OUT/graphs
fi
python3 - <<'PY'
import json, os
d = json.load(open(os.path.join(os.environ["OUT"], "gpu.json")))
a = d.get("attention", {})
for r in a.get("records", []):
    print({k: r.get(k) for k in ("kernel", "seq_len", "mode", "ms", "tflops_per_s", "flash_time_ratio", "error")})
    p = r.get("profile")
    if p:
        print({k: v for k, v in p.items() if k != "rows"})
        for row in p.get("rows", [])[:14]:
            print("   ", round(row["ms_per_step"], 3), row["calls_per_step"], row["name"][:110])
t = d.get("training", {})
print({k: v for k, v in t.items() if k not in ("command", "profile", "rows")})
PY
