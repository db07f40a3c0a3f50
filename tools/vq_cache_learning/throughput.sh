#!/bin/bash
# gau_vq training throughput at T = 8192 (one thread), each cache-read option against the official layer, the lanes paused
# (a running study's train.py and eval.py processes are paused while it runs, so that they do not share the cores)
cd "$(dirname "$0")/../.."
export PYTHONPATH=$PWD
pids=$(pgrep -f "train.py|eval.py" | tr "\n" " ")
kill -STOP $pids
trap "kill -CONT $pids" EXIT
run() { name=$1; model=$2; shift 2; .venv/bin/python -m tvq_exp.bench model --models $model --lengths 8192 --mode train --threads 1 --reps 3 --json studies/vq_cache_learning/throughput/$name.json "$@" 2>&1 | tail -1 | sed "s/^/$name /"; }
run base gau_vq
run mean gau_vq --set gau_vq:attention.cache_keys=mean
run keygrad gau_vq --set gau_vq:attention.cache_key_grad=true
run mean_warmup gau_vq --set gau_vq:attention.cache_keys=mean --set gau_vq:codebook.hard_warmup=1000
run mean_warmup_fisher gau_vq --set gau_vq:attention.cache_keys=mean --set gau_vq:codebook.hard_warmup=1000 \
    --set gau_vq:codebook.fit_weight=fisher --set gau_vq:codebook.fit_floor=0.5
run rotation gau_vq@rotation
run rotation_mean gau_vq@rotation --set gau_vq@rotation:attention.cache_keys=mean
run base2 gau_vq
