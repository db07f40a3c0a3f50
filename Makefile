PY ?= .venv/bin/python
PYTEST = $(PY) -m pytest
# this project's data folder where it sits beside the checkout; elsewhere none (./data, and the smoke preset's
# shipped tiny Shakespeare)
export TVQ_DATA_DIR ?= $(if $(wildcard ../shared/datasets),$(abspath ../shared/datasets))
TB_HOST ?= localhost
# the Triton of the GPU machines this project has been lent (with torch 2.11: docs/benchmarks_gpu/*/env.txt), whose
# compiler builds the kernels there
DEVICE_TRITON ?= 3.6.0

.DEFAULT_GOAL := help
.PHONY: help install venv test test-slow test-all test-mutations bench bench-gpu kernel-report kernel-report-device train tensorboard lint format clean

help: ## list the targets
	@[ -t 1 ] && on='\033[36m' off='\033[0m' || on= off=; \
	grep -E '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk -v on="$$on" -v off="$$off" 'BEGIN {FS = ":.*?## "}; {printf "  %s%-20s%s %s\n", on, $$1, off, $$2}'

install: ## create .venv and install the project (editable) with its dev extras
	python3 -m venv .venv
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev]"

venv: # make install, where $(PY) is missing (test, train and the other targets that run Python depend on it)
	@[ -x "$(PY)" ] || command -v "$(PY)" >/dev/null || { echo "$(PY) missing: make install"; $(MAKE) --no-print-directory install; }

test: venv ## run the test suite (fast checks; how long: docs/benchmarks.md)
	$(PYTEST) -m "not slow" -n 2 --dist loadgroup

test-slow: venv ## run the slow checks (long training comparisons, full benchmarks)
	$(PYTEST) -m slow

test-all: venv ## run every test
	$(PYTEST)

test-mutations: venv ## plant each bug of tools/mutations/mutations.yaml, expect its tests to fail (not in `make test`)
	$(PY) tools/mutations/run.py

bench: venv ## attention and model benchmarks (CPU), tables into bench/
	mkdir -p bench
	$(PY) -m tvq_exp.bench attention --backends dense,vq,linear,flash_chunk --lengths 2048,8192,16384,32768 --mode fwd,fwdbwd --reps 3 --budget 10 --timeout 600 --json bench/attention.json --plot bench/attention.png
	$(PY) -m tvq_exp.bench model --models gau_dense,gau_vq,gau_linear,gau_flash,mha_dense --lengths 1024,2048,4096,8192,16384,32768 --reps 3 --budget 20 --timeout 1000 --json bench/model.json --plot bench/model.png

bench-gpu: venv ## the GPU check on one CUDA device into bench/gpu.json (skips in one line without one)
	$(PY) -m tvq_exp.tools.bench.gpu --out bench/gpu.json

kernel-report: venv ## compile the fused VQ Triton kernels for sm_90a (no GPU needed): registers, spills, shared memory; fails on spills
	$(PY) -m tvq_exp.attention.vq.fused.report

kernel-report-device: venv ## kernel-report under the Triton the lent GPUs run (DEVICE_TRITON=3.6.0, installed into .triton/ once)
	@[ -d .triton/$(DEVICE_TRITON)/triton ] || $(PY) -m pip install -q --no-deps --target .triton/$(DEVICE_TRITON) triton==$(DEVICE_TRITON)
	PYTHONPATH=.triton/$(DEVICE_TRITON) $(PY) -m tvq_exp.attention.vq.fused.report

train: venv ## train the default model (override with ARGS="model=gau_vq data=gutenberg ...")
	$(PY) train.py $(ARGS)

tensorboard: venv ## TensorBoard on the logs folder at http://localhost:6006 (TB_HOST=0.0.0.0 for every interface)
	$(PY) -m tensorboard.main --logdir logs --host $(TB_HOST)

lint: venv ## ruff check
	$(PY) -m ruff check tvq_exp tests train.py eval.py sample.py

format: venv ## ruff format + fix imports
	$(PY) -m ruff check --fix tvq_exp tests train.py eval.py sample.py
	$(PY) -m ruff format tvq_exp tests train.py eval.py sample.py

clean: ## remove logs, caches and build artefacts (keeps .venv)
	rm -rf logs multirun outputs bench .pytest_cache .ruff_cache build *.egg-info
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
