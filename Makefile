PY ?= .venv/bin/python
PYTEST = $(PY) -m pytest
export TVQ_DATA_DIR ?= $(abspath ../shared/datasets)

.DEFAULT_GOAL := help
.PHONY: help install test test-slow test-all test-mutations bench bench-gpu kernel-report train tensorboard lint format clean

help: ## list the targets
	@grep -E '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  \033[36m%-12s\033[0m %s\n", $$1, $$2}'

install: ## create .venv and install the project (editable) with its dev extras
	python3 -m venv .venv
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev]"

test: ## run the test suite (fast checks; how long: docs/benchmarks.md)
	$(PYTEST) -m "not slow" -n 2 --dist loadgroup

test-slow: ## run the slow checks (long training comparisons, full benchmarks)
	$(PYTEST) -m slow

test-all: ## run every test
	$(PYTEST)

test-mutations: ## plant each bug of tools/mutations/mutations.yaml, expect its tests to fail (not in `make test`)
	$(PY) tools/mutations/run.py

bench: ## attention and model benchmarks (CPU), tables into bench/
	mkdir -p bench
	$(PY) -m tvq_exp.bench attention --backends dense,vq,linear,flash_chunk --lengths 2048,8192,16384,32768 --mode fwd,fwdbwd --reps 3 --budget 10 --timeout 600 --json bench/attention.json --plot bench/attention.png
	$(PY) -m tvq_exp.bench model --models gau_dense,gau_vq,gau_linear,gau_flash,mha_dense --lengths 1024,2048,4096,8192,16384,32768 --reps 3 --budget 20 --timeout 1000 --json bench/model.json --plot bench/model.png

bench-gpu: ## the GPU check on one CUDA device into bench/gpu.json (skips in one line without one)
	$(PY) -m tvq_exp.tools.bench.gpu --out bench/gpu.json

kernel-report: ## compile the fused VQ Triton kernels for sm_90a (no GPU needed): registers, spills, shared memory; fails on spills
	$(PY) -m tvq_exp.attention.vq.fused.report

train: ## train the default model (override with ARGS="model=gau_vq data=gutenberg ...")
	$(PY) train.py $(ARGS)

tensorboard: ## open TensorBoard on the logs folder
	$(PY) -m tensorboard.main --logdir logs --bind_all

lint: ## ruff check
	$(PY) -m ruff check tvq_exp tests train.py eval.py sample.py

format: ## ruff format + fix imports
	$(PY) -m ruff check --fix tvq_exp tests train.py eval.py sample.py
	$(PY) -m ruff format tvq_exp tests train.py eval.py sample.py

clean: ## remove logs, caches and build artefacts (keeps .venv)
	rm -rf logs multirun outputs bench .pytest_cache .ruff_cache build *.egg-info
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
