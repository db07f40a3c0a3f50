#!/bin/bash
# the GPU check in one call: CUDA tests, attention (bench attention rows stream), the paper-shape training
export PYTHONPATH=$PWD/.gpu/site:$PWD TVQ_DATA_DIR=$PWD/.gpu/data PYTHONUNBUFFERED=1
( nvidia-smi -L; python3 -c "import torch,lightning,hydra;print('torch',torch.__version__,'lightning',lightning.__version__,'hydra',hydra.__version__)" ) > $OUT/env.txt 2>&1
t0=$SECONDS
timeout 100 python3 -m pytest -q -n 0 -p no:cacheprovider -k cuda tests/attention/test_dense_flex.py tests/attention/test_vq_flex.py > $OUT/tests.log 2>&1
echo "tests rc=$? $((SECONDS-t0)) s"; tail -4 $OUT/tests.log; t0=$SECONDS
timeout 115 python3 -m tvq_exp.bench attention --device cuda --dtype bf16 --backends dense_flex,vq,vq_flex --lengths 16384,65536 --mode fwd,fwdbwd --window-bias --reps 3 --budget 3 --timeout 40 --mm-size 2048 --json $OUT/attention.json > $OUT/attention.log 2>&1
echo "attention rc=$? $((SECONDS-t0)) s"; t0=$SECONDS
timeout 125 python3 train.py experiment=enwik8_paper trainer=gpu trainer.devices=1 global_batch_size=null data=kjv data.batch_size=16 trainer.check_val_every_n_epoch=null trainer.val_check_interval=1000000 trainer.limit_val_batches=1 trainer.num_sanity_val_steps=0 trainer.max_steps=1000000 trainer.log_every_n_steps=5 ++trainer.max_time=00:00:01:30 logger=csv trainer.enable_progress_bar=false paths.log_dir=/tmp/tl run_name=gpu > $OUT/training.log 2>&1
echo "training rc=$? $((SECONDS-t0)) s"; cp /tmp/tl/runs/gpu/csv/metrics.csv $OUT/metrics.csv 2>/dev/null; tail -5 $OUT/training.log
