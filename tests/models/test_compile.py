"""``torch.compile`` of the model equals eager on CPU (forward and gradients), without graph breaks."""

from __future__ import annotations

import functools

import torch

from tvq_exp.attention import build_attention
from tvq_exp.models.blocks import GAUBlock
from tvq_exp.models.decoder import Decoder


def test_compiled_gau_vq_equals_eager() -> None:
    torch._dynamo.reset()
    model = Decoder(
        256,
        32,
        2,
        functools.partial(GAUBlock, d_k=16),
        functools.partial(build_attention, "vq", codebook_size=16, block_len=8),
    ).train()
    x = torch.randint(0, 256, (2, 32))
    eager = model(x)
    eager.logits.sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    for q in model.quantizers():  # the eager call accumulated codebook statistics: start the same
        q.pending_count.zero_()
        q.pending_sum.zero_()
    compiled = torch.compile(model, dynamic=False, fullgraph=True)
    out = compiled(x)
    out.logits.sum().backward()
    assert torch.allclose(out.logits, eager.logits, atol=1e-5, rtol=1e-5)
    for name, p in model.named_parameters():
        assert torch.allclose(p.grad, grads[name], atol=1e-5, rtol=1e-4), name
