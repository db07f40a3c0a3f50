"""FSDP pieces that run in one process: activation checkpointing recomputes each block without changing the
loss, the gradients or the codebook statistics (the recomputation must not count the keys twice)."""

from __future__ import annotations

import functools

import pytest
import torch

from tvq_exp.attention import build_attention
from tvq_exp.models.blocks import GAUBlock
from tvq_exp.models.decoder import Decoder
from tvq_exp.models.sharding import shard_decoder


def make(assignment: str = "nearest", fit_weight: str = "uniform") -> Decoder:
    torch.manual_seed(0)
    block = functools.partial(GAUBlock, d_k=16, layerdrop=0.1, dropout=0.1)
    codebook = {"assignment": assignment, "temperature": 2.0, "fit_weight": fit_weight}
    attention = functools.partial(build_attention, "vq", codebook_size=8, block_len=4, codebook=codebook)
    return Decoder(256, 32, 2, block, attention).train()


def loss_grads_statistics(
    checkpointing: bool, assignment: str, fit_weight: str = "uniform"
) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
    model = make(assignment, fit_weight)
    model.activation_checkpointing = checkpointing
    x = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))
    torch.manual_seed(2)  # dropout, LayerDrop and sampled codes draw here: the recomputation must replay them
    out = model(x)
    loss = torch.nn.functional.cross_entropy(out.logits.flatten(0, 1), x.flatten()) + out.aux["loss"]
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    stats = [q.pending_count.clone() for q in model.quantizers()] + [
        q.pending_sum.clone() for q in model.quantizers()
    ]
    return loss.detach(), grads, stats


@pytest.mark.parametrize(
    "assignment, fit_weight", [("nearest", "uniform"), ("sampled", "uniform"), ("nearest", "fisher")]
)
def test_activation_checkpointing_changes_no_loss_gradient_or_codebook_statistic(
    assignment: str, fit_weight: str
) -> None:
    plain = loss_grads_statistics(False, assignment, fit_weight)
    checkpointed = loss_grads_statistics(True, assignment, fit_weight)
    assert torch.equal(plain[0], checkpointed[0])
    assert len(plain[1]) == len(checkpointed[1]) > 0
    for a, b in zip(plain[1], checkpointed[1], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    for a, b in zip(
        plain[2], checkpointed[2], strict=True
    ):  # counted once, not once more in the backward pass
        if fit_weight == "uniform":
            assert torch.equal(a, b)
        else:  # weighted by the key gradients, which agree to rounding
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    # one count per key (2 sequences x 16 positions), per head; fisher: weights of mean 1
    assert float(plain[2][0].sum()) == pytest.approx(2 * 16, rel=1e-6)


def test_unknown_dtype_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"param_dtype='fp8'.*bf16"):
        shard_decoder(make(), mesh=None, param_dtype="fp8")  # type: ignore[arg-type]
