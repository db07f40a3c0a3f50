#!/bin/bash
# prepared for the next device session (issue 40), not yet run (after the second H200 check of 2026-11-30). Two
# calls, each through the device tool with carry [".gpu"] and a timeout of 540 s; .gpu/ (in .git/info/exclude) holds
# site/ (hydra, omegaconf, antlr4 copied from .venv's site-packages: the lent machines lack them) and
# data/text/kjv_bible.txt. A new checkout has no .gpu/:
#
#   bash docs/benchmarks_gpu/2026-11-30-h200-second/next.sh prepare   # here, before the first call: makes .gpu/
#   bash docs/benchmarks_gpu/2026-11-30-h200-second/next.sh a   # make bench-gpu in full: attention, the paper step (the
#       preset's CUDA graphs, without torch 2.11's graph breaks), the CUDA tests (each failure's reason kept)
#   TOTAL=<s> bash docs/benchmarks_gpu/2026-11-30-h200-second/next.sh b   # graphed_step again; the paper step in the
#       default mode with torch's graph-break logs (TOTAL: the seconds the call may take, default 520)
#
# The figures to read: gpu.json's attention.records (ms, flash_time_ratio; vq_triton_graphed against vq_triton),
# training (tokens_per_s, mfu, profile.by_kind, profile.compile: graph breaks should be 0), tests (not_passed,
# reasons); in call b graphed.json (host_share, mfu) and default.log (graph breaks).
# prepare and a are the first check's (docs/benchmarks_gpu/2026-11-30-h200/next.sh), unchanged
case "$1" in
  prepare|a) exec bash docs/benchmarks_gpu/2026-11-30-h200/next.sh "$1" ;;
  b) ;;
  *) echo "usage: next.sh prepare|a|b"; exit 2 ;;
esac
export PYTHONPATH=$PWD/.gpu/site:$PWD TVQ_DATA_DIR=$PWD/.gpu/data PYTHONUNBUFFERED=1
t0=$SECONDS
  # 1. graphed_step: the ceiling again (the graph breaks under torch 2.11 gone: 29.7% MFU on 2026-11-30)
  timeout $(( ${TOTAL:-520} < 400 ? 150 : 200 )) python3 -m tvq_exp.tools.bench.graphed_step --seconds 30 --out $OUT/graphed.json > $OUT/graphed.log 2>&1
  echo "graphed rc=$? $((SECONDS-t0)) s"; tail -5 $OUT/graphed.log
  # 2. the paper step in the default mode (launched by the host), with torch's logs: how much of its gap to
  #    graphed_step's eager step (95.8k against 115.9k tokens/s) the 14 graph breaks were
  left=$((${TOTAL:-520} - (SECONDS - t0)))
  if [ $left -gt 60 ]; then
    TORCH_LOGS=graph_breaks,recompiles timeout $left python3 train.py experiment=enwik8_paper trainer=gpu \
      trainer.devices=1 global_batch_size=null trainer.check_val_every_n_epoch=null trainer.val_check_interval=1000000 \
      trainer.limit_val_batches=1 trainer.max_steps=60 trainer.log_every_n_steps=2 logger=csv \
      trainer.enable_progress_bar=false ++logger.csv.flush_logs_every_n_steps=2 data=kjv data.batch_size=16 \
      module.compile_mode=default hydra.run.dir=/tmp/default > $OUT/default.log 2>&1
    echo "default rc=$? $((SECONDS-t0)) s"
    cp /tmp/default/csv/metrics.csv $OUT/default_metrics.csv 2>/dev/null
    echo "graph breaks: $(grep -c 'Graph break' $OUT/default.log)"
  fi
  python3 - <<'PY'
import csv, json, os
out = os.environ["OUT"]
path = os.path.join(out, "graphed.json")
if os.path.exists(path):
    d = json.load(open(path))
    print({k: d.get(k) for k in ("eager_ms_per_step", "graphed_ms_per_step", "host_share", "mfu", "eager_mfu")})
path = os.path.join(out, "default_metrics.csv")
rows = [r for r in csv.DictReader(open(path))] if os.path.exists(path) else []
print("default tokens/s, mfu by step", [(r["step"], r.get("throughput/tokens_per_s"), r.get("throughput/mfu"))
                                       for r in rows if r.get("throughput/tokens_per_s")][-6:])
PY
