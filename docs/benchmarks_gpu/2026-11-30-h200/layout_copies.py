"""The key-sized tensors one forward + backward of VQ's fused layer makes, on CPU: the GPU check's ``(B, T, H, d)``
leaves seen as ``(B, H, T, d)`` (4 heads of 16, 2 sequences of 64 positions, L = S = 16), ``kernel=triton`` under the
interpreter, every aten op logged (the custom ops as one op each: what they do inside is not seen). Copies are the
``clone``/``copy_``/``_to_copy`` lines. The figures of docs/benchmarks.md's twenty-eighth-session section:

    PYTHONPATH=. TRITON_INTERPRET=1 .venv/bin/python docs/benchmarks_gpu/2026-11-30-h200/layout_copies.py
"""

import torch

from tests.helpers.ops import OpLog
from tvq_exp.attention import build_attention

B, T, HEADS, DIM, BLOCK = 2, 64, 4, 16, 16
torch.manual_seed(0)
layer = build_attention(
    "vq", d_k=DIM, d_v=DIM, heads=HEADS, codebook_size=BLOCK // 2, block_len=BLOCK, kernel="triton"
)
leaves = [torch.randn(B, T, HEADS, DIM, requires_grad=True) for _ in range(3)]
with OpLog() as log:
    out = layer(*(x.transpose(1, 2) for x in leaves))[0]
    forward = len(log.ops)
    out.backward(torch.randn(B, T, HEADS, DIM).transpose(1, 2))
size = B * T * HEADS * DIM
sized = [
    ("forward" if i < forward else "backward", op.name)
    for i, op in enumerate(log.ops)
    if not op.free and op.numel >= size
]
for phase, name in sized:
    print(f"{phase:8s} {name}")
copies = [name for _, name in sized if name in ("aten.clone", "aten.copy_", "aten._to_copy")]
print(f"{len(copies)} key-sized copies in a forward + backward")
