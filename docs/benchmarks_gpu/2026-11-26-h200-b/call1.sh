#!/bin/bash
# device call 1: the repeat probe on one GPU (conf/study/repeat_gpu.yaml: 7 runs side by side, 3:40 of training
# each) while the CUDA tests run; the result files and run logs come back as one archive
export PYTHONPATH=$PWD/.gpu/site:$PWD TVQ_DATA_DIR=$PWD/.gpu/data PYTHONUNBUFFERED=1
t0=$SECONDS
tar xJf .gpu/gutenberg.tar.xz -C .gpu/data/text
( nvidia-smi -L; nproc; python3 -c "import torch,lightning,hydra;print('torch',torch.__version__,'lightning',lightning.__version__,'hydra',hydra.__version__)" ) > $OUT/env.txt 2>&1
cat $OUT/env.txt; echo "setup $((SECONDS-t0)) s"
python3 -m tvq_exp.analysis study run conf/study/repeat_gpu.yaml --out studies/repeat_gpu --parallel 7 --cores 14 > $OUT/study.log 2>&1 &
study=$!
timeout 200 python3 -m pytest -q -n 0 -p no:cacheprovider -k cuda tests/attention/test_dense_flex.py tests/attention/test_vq_flex.py > $OUT/tests.log 2>&1
echo "tests rc=$? $((SECONDS-t0)) s"; tail -4 $OUT/tests.log
timeout $((335 - SECONDS)) tail --pid=$study -f /dev/null; echo "study done or cut at $((SECONDS-t0)) s"
tar czf $OUT/repeat_gpu.tgz --exclude='*.ckpt' --exclude='checkpoints' studies/repeat_gpu
tail -12 $OUT/study.log; grep -h "step\|error\|Error" studies/repeat_gpu/runs/*/job.log | tail -20
