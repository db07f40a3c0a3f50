#!/bin/bash
# prepared for the next device session (issue 40), not yet run: the paper step from CUDA graphs with torch's logs
# (graph breaks, recompiles, CUDA-graph recordings and skips), then the default step timed by make bench-gpu's
# training section on the same machine, so the two throughputs compare within one call; within 530 s. Run through
# the device tool with carry [".gpu"] and a timeout of 540 s; .gpu/ (in .git/info/exclude) holds site/ (hydra,
# omegaconf, antlr4 copied from .venv's site-packages: the lent machines lack them) and data/text/kjv_bible.txt.
export PYTHONPATH=$PWD/.gpu/site:$PWD TVQ_DATA_DIR=$PWD/.gpu/data PYTHONUNBUFFERED=1
t0=$SECONDS
# 1. up to 60 steps from CUDA graphs, logged every 2 steps (throughput rows in metrics.csv), with torch's logs
TORCH_LOGS=graph_breaks,recompiles,cudagraphs,perf_hints timeout 270 python3 train.py experiment=enwik8_paper \
  trainer=gpu trainer.devices=1 global_batch_size=null trainer.check_val_every_n_epoch=null \
  trainer.val_check_interval=1000000 trainer.limit_val_batches=1 trainer.max_steps=60 trainer.log_every_n_steps=2 \
  logger=csv trainer.enable_progress_bar=false ++logger.csv.flush_logs_every_n_steps=2 data=kjv data.batch_size=16 \
  +module.compile_mode=reduce-overhead hydra.run.dir=/tmp/graphs > $OUT/graphs.log 2>&1
echo "graphs rc=$? $((SECONDS-t0)) s"
cp /tmp/graphs/csv/metrics.csv $OUT/graphs_metrics.csv 2>/dev/null
echo "graph breaks: $(grep -c 'Graph break in user code' $OUT/graphs.log)"
grep "Graph break in user code" $OUT/graphs.log | sed 's/.*user code at //' | sort | uniq -c | head
grep -i "skipping cudagraphs\|re-record" $OUT/graphs.log | cut -c1-240 | sort | uniq -c | head
python3 - <<'PY'
import csv, os
path = os.path.join(os.environ["OUT"], "graphs_metrics.csv")
rows = [r for r in csv.DictReader(open(path))] if os.path.exists(path) else []
rates = [(r["step"], r["throughput/tokens_per_s"]) for r in rows if r.get("throughput/tokens_per_s")]
print("graphs: tokens/s by step", rates[-8:])
PY
# 2. the default step on the same machine (its compile summary says whether it compiled whole)
left=$((525 - (SECONDS - t0)))
timeout $left python3 -m tvq_exp.tools.bench.gpu --out $OUT/gpu_default.json --data kjv --skip attention,tests \
  --budgets 1,$((left - 5)),1 --train-seconds 60 --compile-seconds $((left - 80)) > $OUT/bench.log 2>&1
echo "bench rc=$? $((SECONDS-t0)) s"
python3 - <<'PY'
import json, os
path = os.path.join(os.environ["OUT"], "gpu_default.json")
if os.path.exists(path):
    t = json.load(open(path)).get("training", {})
    print({k: v for k, v in t.items() if k not in ("command", "profile", "rows")})
    print("compile:", json.dumps(t.get("profile", {}).get("compile"))[:1500])
PY
