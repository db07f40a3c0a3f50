#!/bin/bash
# device call 2, started while the machine was still warm from call 1 (the command given to the device tool): the
# CUDA tests of the fused kernels beside the cache-learning study's copy_only probe at 5x the budget (run_study.sh)
export PYTHONPATH=$PWD/.gpu/site:$PWD TVQ_DATA_DIR=$PWD/.gpu/data PYTHONUNBUFFERED=1; (timeout 230 python3 -m pytest -q -n 0 -p no:cacheprovider -k cuda tests/quantize/test_fused_nearest.py tests/attention/test_vq_triton.py tests/attention/test_vq_triton_compile.py tests/attention/test_vq_triton_cuda.py > $OUT/tests.log 2>&1; echo "tests rc=$?" >> $OUT/tests.log) & bash .gpu/call2.sh 250; wait; tail -30 $OUT/tests.log
