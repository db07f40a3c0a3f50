#!/bin/bash
# device call 2 (issue 43): the cache-learning study's copy_only probe at 5x the budget on the one GPU, dense / VQ /
# VQ + cache_key_grad, 3 seeds each, side by side; the result files and run logs come back as one archive
export PYTHONPATH=$PWD/.gpu/site:$PWD TVQ_DATA_DIR=$PWD/.gpu/data PYTHONUNBUFFERED=1
t0=$SECONDS
tar xJf .gpu/gutenberg.tar.xz -C .gpu/data/text; echo "setup $((SECONDS-t0)) s"
timeout $1 python3 -m tvq_exp.analysis study run conf/study/vq_cache_learning.yaml --out studies/vq_cache_learning \
  --regimes copy_only_5k_gpu --runs dense,vq,vq_keygrad --parallel 9 --cores 16 > $OUT/study.log 2>&1
echo "study rc=$? $((SECONDS-t0)) s"
tar czf $OUT/copy_gpu.tgz --exclude='*.ckpt' --exclude='checkpoints' studies/vq_cache_learning/results/*copy_only_5k_gpu* studies/vq_cache_learning/runs/*copy_only_5k_gpu*
tail -15 $OUT/study.log; grep -h "step" studies/vq_cache_learning/runs/*copy_only_5k_gpu*/job.log | tail -12
