#!/bin/bash
# prepared for the next device session (issue 40), not yet run: the paper step from CUDA graphs, with what torch
# says while it compiles and records (graph breaks, recompiles, CUDA-graph recordings and skips), then its timed
# figure from make bench-gpu's training section beside the default step's, within 530 s. Run through the device
# tool with carry [".gpu"] (see 2026-11-28-h200/run.sh for what .gpu/ holds) and a timeout of 540 s.
export PYTHONPATH=$PWD/.gpu/site:$PWD TVQ_DATA_DIR=$PWD/.gpu/data PYTHONUNBUFFERED=1
t0=$SECONDS
# 1. 30 steps from CUDA graphs, logged every 2 steps, with torch's logs: where it breaks, recompiles, records
TORCH_LOGS=graph_breaks,recompiles,cudagraphs,perf_hints timeout 200 python3 train.py experiment=enwik8_paper \
  trainer=gpu trainer.devices=1 global_batch_size=null trainer.check_val_every_n_epoch=null \
  trainer.val_check_interval=1000000 trainer.limit_val_batches=1 trainer.max_steps=30 trainer.log_every_n_steps=2 \
  logger=csv trainer.enable_progress_bar=false ++logger.csv.flush_logs_every_n_steps=2 data=kjv data.batch_size=16 \
  +module.compile_mode=reduce-overhead hydra.run.dir=/tmp/graphs > $OUT/graphs.log 2>&1
echo "graphs rc=$? $((SECONDS-t0)) s"
cp /tmp/graphs/csv/metrics.csv $OUT/graphs_metrics.csv 2>/dev/null
grep -c "Graph break in user code" $OUT/graphs.log; grep "Graph break in user code" $OUT/graphs.log | cut -c1-240 | sort | uniq -c | head
grep -i "skipping cudagraphs\|re-record" $OUT/graphs.log | cut -c1-240 | sort | uniq -c | head
cut -c1-300 $OUT/graphs_metrics.csv 2>/dev/null | tail -4
# 2. the timed figures: the default step, then the step from CUDA graphs, each with the compile time it needs
left=$((525 - (SECONDS - t0)))
timeout $((left / 2)) python3 -m tvq_exp.tools.bench.gpu --out $OUT/gpu_default.json --data kjv --skip attention,tests \
  --budgets 1,$((left / 2 - 5)),1 --train-seconds 40 --compile-seconds 90 > $OUT/bench.log 2>&1
left=$((525 - (SECONDS - t0)))
timeout $left python3 -m tvq_exp.tools.bench.gpu --out $OUT/gpu_graphs.json --data kjv --skip attention,tests \
  --budgets 1,$((left - 5)),1 --train-seconds 40 --compile-seconds $((left - 60)) \
  --train-overrides +module.compile_mode=reduce-overhead >> $OUT/bench.log 2>&1
echo "bench rc=$? $((SECONDS-t0)) s"
python3 - <<'PY'
import json, os
for name in ("gpu_default.json", "gpu_graphs.json"):
    path = os.path.join(os.environ["OUT"], name)
    if os.path.exists(path):
        t = json.load(open(path)).get("training", {})
        print(name, {k: v for k, v in t.items() if k not in ("command", "profile", "rows")})
        print("  compile:", json.dumps(t.get("profile", {}).get("compile"))[:1500])
PY
