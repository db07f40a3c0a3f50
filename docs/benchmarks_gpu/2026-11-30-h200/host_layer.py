"""The host's own work in one forward + backward of VQ's fused layer, on CPU: the Triton launches made free (the
interpreter's ``run`` replaced by nothing) and the tensors tiny (4 heads of 16, 256 positions, L = S = 32, the GPU
check's ``(B, T, H, d)`` leaves), so what is timed is the layer's Python, the custom ops' dispatch and its ATen ops'
host cost. The figures of docs/benchmarks.md's 2026-11-30 twenty-seventh-session section (one mean of 50 calls then;
the best of seven such rounds since the twenty-ninth session, whose machine was about four times slower; and the
Python function calls of one forward + backward, counted by cProfile, the same on any machine):

    PYTHONPATH=. TRITON_INTERPRET=1 OMP_NUM_THREADS=1 .venv/bin/python docs/benchmarks_gpu/2026-11-30-h200/host_layer.py
"""

import cProfile
import pstats
import time

import torch
import triton.runtime.interpreter as interpreter

from tests.helpers.ops import OpLog
from tvq_exp.attention import build_attention

interpreter.InterpretedFunction.run = lambda self, *args, **kwargs: None  # every launch free
torch.manual_seed(0)
HEADS, DIM, LENGTH, BLOCK = 4, 16, 256, 32
layer = build_attention(
    "vq", d_k=DIM, d_v=DIM, heads=HEADS, codebook_size=BLOCK, block_len=BLOCK, kernel="triton"
)
leaves = [torch.randn(1, LENGTH, HEADS, DIM).requires_grad_() for _ in range(3)]
grad = torch.randn(1, LENGTH, HEADS, DIM).transpose(1, 2)


def call() -> None:
    q, k, v = (x.transpose(1, 2) for x in leaves)
    layer(q, k, v)[0].backward(grad)
    for x in leaves:
        x.grad = None


for _ in range(3):
    call()
with OpLog() as log:
    call()
launches = [op.name for op in log.launches()]
CALLS, ROUNDS = 50, 7  # the best round's mean: a shared CPU's other work only ever adds time
rounds = []
for _ in range(ROUNDS):
    started = time.perf_counter()
    for _ in range(CALLS):
        call()
    rounds.append((time.perf_counter() - started) / CALLS * 1e3)
profiler = cProfile.Profile()  # a count a shared CPU's clock cannot blur: the Python calls of one call
profiler.enable()
for _ in range(10):
    call()
profiler.disable()
python_calls = pstats.Stats(profiler).total_calls / 10
print(
    f"{min(rounds):.2f} ms of host work per forward + backward (best of {ROUNDS} rounds of {CALLS}; median "
    f"{sorted(rounds)[ROUNDS // 2]:.2f}); {len(launches)} ATen ops that launch on a GPU; {python_calls:.0f} Python "
    "function calls"
)
