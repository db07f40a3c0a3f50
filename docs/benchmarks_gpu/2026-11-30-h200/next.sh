#!/bin/bash
# run on 2026-11-30 (the second H200 check of the day, thirty-first session: docs/benchmarks_gpu/2026-11-30-h200-second/;
# `next.sh a`, then `TOTAL=395 next.sh b`). Two calls, each through the device tool with carry
# [".gpu"] and a timeout of 540 s; .gpu/ (in .git/info/exclude) holds site/ (hydra, omegaconf, antlr4 copied from
# .venv's site-packages: the lent machines lack them) and data/text/kjv_bible.txt. A new checkout has no .gpu/:
#
#   bash docs/benchmarks_gpu/2026-11-30-h200/next.sh prepare   # here, before the first call: makes .gpu/
#
#   bash docs/benchmarks_gpu/2026-11-30-h200/next.sh a   # make bench-gpu in full: attention, the paper step, the CUDA
#                                                         # tests (the targets, timed on what changed since 2026-11-30:
#                                                         # the sorted block sums, the aligned XL table, the carried
#                                                         # state's copy); the 32k profiles now name the host's ops
#   bash docs/benchmarks_gpu/2026-11-30-h200/next.sh b   # the paper step eager and replayed from CUDA graphs (the
#                                                         # host's share, the MFU its device work allows), the paper
#                                                         # step with the fused kernels (kernel=triton) profiled, then
#                                                         # (time left) the module's reduce-overhead mode with logs
#
# The figures to read: gpu.json's attention.records (ms, flash_time_ratio; vq_triton_graphed against vq_triton: the
# eager call's kernels replayed from a CUDA graph, how much of its wall clock is the host's; the 32k vq_triton
# profile's "host" rows: what the host spends the eager layer's call on), training (tokens_per_s, mfu, profile.by_kind, profile.host,
# profile.compile), tests; in call b graphed.json (host_share, mfu), fused_profile.json, graphs.log (graph breaks,
# recompiles, CUDA-graph skips).
if [ "$1" = prepare ]; then
  site=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])") || exit 1
  rm -rf .gpu/site; mkdir -p .gpu/site .gpu/data/text .git/info
  for package in hydra omegaconf antlr4; do cp -r "$site/$package" .gpu/site/ || exit 1; done
  cp "${TVQ_DATA_DIR:-../shared/datasets}/text/kjv_bible.txt" .gpu/data/text/ || exit 1
  grep -qx ".gpu/" .git/info/exclude 2>/dev/null || echo ".gpu/" >> .git/info/exclude
  du -sh .gpu; exit 0
fi
export PYTHONPATH=$PWD/.gpu/site:$PWD TVQ_DATA_DIR=$PWD/.gpu/data PYTHONUNBUFFERED=1
t0=$SECONDS
( nvidia-smi -L; python3 -c "import torch,triton;print('torch',torch.__version__,'triton',triton.__version__)" ) > $OUT/env.txt 2>&1
cat $OUT/env.txt
summary() {
  python3 - "$@" <<'PY'
import json, os, sys
for name in sys.argv[1:]:
    path = os.path.join(os.environ["OUT"], name)
    if not os.path.exists(path):
        print(name, "missing"); continue
    d = json.load(open(path))
    a = d.get("attention", {})
    if a: print("mm", a.get("mm_tflops"))
    for r in a.get("records", []):
        print({k: r.get(k) for k in ("kernel", "seq_len", "mode", "ms", "tflops_per_s", "flash_time_ratio", "error")})
        p = r.get("profile")
        if p and "host" in p:
            print("  device", round(p["ms_per_step"], 2), "wall", round(p["wall_ms_per_step"], 2),
                  "host", round(p["host"]["ms_per_step"], 2), [(x["name"][:40], round(x["ms_per_step"], 3))
                                                              for x in p["host"]["rows"][:8]])
    t = d.get("training", {})
    if t:
        print(name, {k: v for k, v in t.items() if k not in ("command", "profile", "rows")})
        p = t.get("profile", {})
        print("  by_kind", p.get("by_kind"), "calls", p.get("calls_per_step"), "wall", p.get("wall_ms_per_step"))
        print("  host", [(x["name"][:40], round(x["ms_per_step"], 2)) for x in p.get("host", {}).get("rows", [])[:10]])
        print("  compile", json.dumps(p.get("compile"))[:800])
    if d.get("tests"): print("tests", {k: v for k, v in d["tests"].items() if k != "summary"})
PY
}
if [ "$1" = a ]; then
  # the issue's order: make bench-gpu first, in one call (budgets: attention 150 s, training 170 s, tests 130 s)
  timeout 520 python3 -m tvq_exp.tools.bench.gpu --out $OUT/gpu.json --data kjv --budgets 150,170,130 \
    --train-seconds 60 --compile-seconds 80 > $OUT/bench.log 2>&1
  echo "bench-gpu rc=$? $((SECONDS-t0)) s"
  summary gpu.json
elif [ "$1" = b ]; then
  # In the order of what they tell, each writing to $OUT as it goes (a call cut short by the device budget keeps what
  # was written). 1. the paper step eager (compiled blocks) and replayed from CUDA graphs in one process: the host's
  # share of the step and the MFU its device work allows (tvq_exp/tools/bench/graphed_step.py)
  timeout $(( ${TOTAL:-520} < 400 ? 150 : 200 )) python3 -m tvq_exp.tools.bench.graphed_step --seconds 30 --out $OUT/graphed.json > $OUT/graphed.log 2>&1
  echo "graphed rc=$? $((SECONDS-t0)) s"; tail -5 $OUT/graphed.log
  python3 - <<'PY'
import json, os
path = os.path.join(os.environ["OUT"], "graphed.json")
if os.path.exists(path):
    d = json.load(open(path))
    print({k: d.get(k) for k in ("batch", "compile_s", "eager_ms_per_step", "graphed_ms_per_step", "host_share",
                                 "tokens_per_s", "mfu", "mfu_datasheet", "eager_mfu", "peak_mem_mb", "losses")})
PY
  # 2. the module's own CUDA-graph mode (compile_mode=reduce-overhead) with torch's logs
  left=$((${TOTAL:-520} - (SECONDS - t0)))
  if [ $left -gt 60 ]; then
    TORCH_LOGS=graph_breaks,recompiles,cudagraphs,perf_hints timeout $left python3 train.py experiment=enwik8_paper \
      trainer=gpu trainer.devices=1 global_batch_size=null trainer.check_val_every_n_epoch=null \
      trainer.val_check_interval=1000000 trainer.limit_val_batches=1 trainer.max_steps=60 trainer.log_every_n_steps=2 \
      logger=csv trainer.enable_progress_bar=false ++logger.csv.flush_logs_every_n_steps=2 data=kjv \
      data.batch_size=16 +module.compile_mode=reduce-overhead hydra.run.dir=/tmp/graphs > $OUT/graphs.log 2>&1
    echo "graphs rc=$? $((SECONDS-t0)) s"
    cp /tmp/graphs/csv/metrics.csv $OUT/graphs_metrics.csv 2>/dev/null
    echo "graph breaks: $(grep -c 'Graph break in user code' $OUT/graphs.log)"
    grep -i "skipping cudagraphs\|re-record\|recompile_limit" $OUT/graphs.log | cut -c1-240 | sort | uniq -c | head
  fi
  # 3. with what is left, the paper step with the fused kernels at d_v = 1536 (kernel=triton: six value chunks, no scores written)
  #    against call a's kernel=auto (the plain kernel's GEMMs and fp32 scores), profiled after 12 steps
  left=$((${TOTAL:-520} - (SECONDS - t0)))
  [ $left -gt 60 ] && timeout $(( left < 200 ? left : 200 )) python3 train.py experiment=enwik8_paper trainer=gpu trainer.devices=1 \
    global_batch_size=null trainer.check_val_every_n_epoch=null trainer.val_check_interval=1000000 \
    trainer.limit_val_batches=1 trainer.max_steps=40 trainer.log_every_n_steps=2 logger=csv \
    trainer.enable_progress_bar=false ++logger.csv.flush_logs_every_n_steps=2 data=kjv data.batch_size=16 \
    model.attention.kernel=triton debug=device_profile callbacks.device_profile.skip=12 \
    callbacks.device_profile.steps=3 callbacks.device_profile.rows=25 hydra.run.dir=/tmp/fused > $OUT/fused.log 2>&1
  echo "fused rc=$? $((SECONDS-t0)) s"
  cp /tmp/fused/csv/metrics.csv $OUT/fused_metrics.csv 2>/dev/null
  cp /tmp/fused/device-profile.json $OUT/fused_profile.json 2>/dev/null
  python3 - <<'PY'
import csv, json, os
out = os.environ["OUT"]
for name in ("fused_metrics.csv", "graphs_metrics.csv"):
    path = os.path.join(out, name)
    rows = [r for r in csv.DictReader(open(path))] if os.path.exists(path) else []
    print(name, "tokens/s, mfu by step", [(r["step"], r.get("throughput/tokens_per_s"), r.get("throughput/mfu"))
                                           for r in rows if r.get("throughput/tokens_per_s")][-6:])
path = os.path.join(out, "fused_profile.json")
if os.path.exists(path):
    p = json.load(open(path))
    print("fused profile", {k: p.get(k) for k in ("ms_per_step", "wall_ms_per_step", "by_kind", "calls_per_step")})
    print("  rows", [(r["name"][:50], round(r["ms_per_step"], 2)) for r in p.get("rows", [])[:12]])
PY
else
  echo "usage: next.sh prepare|a|b"; exit 2
fi
