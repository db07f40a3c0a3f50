"""The paper preset's compiled blocks as on CUDA, on CPU: graph breaks and graphs of 4 training steps and a
validation batch (2 layers, d_model 64, bf16 autocast; the fused search's op, as CUDA runs it: under Triton's
interpreter since the twenty-ninth session, the plain search its CPU kernel before). The figures of
docs/benchmarks.md's 2026-11-30 section ("After the calls, on CPU"):

    PYTHONPATH=. TRITON_INTERPRET=1 TVQ_DATA_DIR=../shared/datasets TORCH_LOGS=graph_breaks \\
        .venv/bin/python docs/benchmarks_gpu/2026-11-30-h200/cpu_graph_breaks.py /tmp/breaks

``--fused`` (with ``TRITON_INTERPRET=1``, and ``TORCH_LOGS=graph_breaks,recompiles``): every VQ op as the GPU takes it,
the window + cache and the cache means through their custom ops too (``kernel=triton``, run under the interpreter), on
a shorter TBPTT shape of the same form (updates of 128 tokens, sequences of 512, ``L = S = 32``): the twenty-seventh
session's check (docs/benchmarks.md, 2026-11-30).
"""

import importlib
import sys
from pathlib import Path

from torch._dynamo.utils import counters

import tvq_exp.quantize.codebook as codebook
import tvq_exp.quantize.fused_nearest  # noqa: F401 - registers tvq::nearest_code
from tests.helpers.config import train_run

kmeans = importlib.import_module("tvq_exp.quantize.kmeans")  # (the package's name kmeans is the function)

kmeans.fused_search = codebook.fused_search = lambda x: True  # the quantiser takes the op, as on CUDA

OVERRIDES = [
    "experiment=enwik8_paper", "trainer=cpu", "trainer.devices=1", "trainer.precision=bf16-mixed",
    "model.n_layers=2", "model.d_model=64", "++model.block.d_k=16", "data=kjv", "data.batch_size=2",
    "trainer.max_steps=4", "module.compile=true", "logger=csv", "trainer.enable_progress_bar=false",
    "trainer.limit_val_batches=1", "trainer.val_check_interval=1000000", "trainer.check_val_every_n_epoch=null",
    "global_batch_size=null",
]  # fmt: skip
FUSED = [
    "++model.attention.kernel=triton", "data.seq_len=128", "data.sequence_len=512", "block_len=32", "codebook_size=32",
    "init_batches=1",
]  # fmt: skip
train_run(OVERRIDES + (FUSED if "--fused" in sys.argv else []), Path(sys.argv[1]))
print("graph breaks", sum(counters["graph_break"].values()), "graphs", counters["stats"]["unique_graphs"])
