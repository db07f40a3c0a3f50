"""The paper step with and without the host's launching (``tvq_exp.tools.bench.graphed_step``): the stepper runs the
module's training step position by position with the state handed on, and on CUDA its replayed graphs compute what
its eager steps do."""

from __future__ import annotations

import pytest
import torch

from tvq_exp.tools.bench import graphed_step
from tvq_exp.tools.bench.graphed_step import Stepper, compose_run

# the paper's step in miniature: 2 GAUs, blocks of 16, 3 TBPTT positions of 32 tokens
TINY = (
    "experiment=enwik8_paper", "trainer.devices=1", "global_batch_size=null", "model.d_model=32",
    "model.n_layers=2", "model.block.d_k=16", "block_len=16", "codebook_size=16", "module.position_bucket_len=16",
    "data.seq_len=32", "data.sequence_len=96", "data.batch_size=2",
)  # fmt: skip


def tiny(*overrides: str) -> dict:
    return compose_run([*TINY, *overrides])


def test_the_stepper_hands_each_positions_state_to_the_next_and_a_sequence_starts_afresh() -> None:
    stepper = Stepper(tiny("trainer=cpu", "module.compile=false"), torch.device("cpu"))
    assert (stepper.positions, stepper.batch, stepper.seq_len) == (3, 2, 32)
    assert stepper.tokens.shape == (3, 2, 33) and stepper.flops_per_step() == stepper.module.model.flops(
        32, 2, backward=True
    )
    stepper.sequence()
    assert [s[0].position for s in stepper.states] == [32, 64, 96]  # each position continues the last's state
    assert all(torch.isfinite(x) for x in stepper.losses)
    stepper.step(0)
    assert stepper.states[0][0].position == 32  # a new sequence: no state carried into position 0
    params = [p.detach().clone() for p in stepper.module.model.parameters()]
    stepper.step(1)
    assert any(not torch.equal(a, b) for a, b in zip(params, stepper.module.model.parameters(), strict=True))


def test_the_rates_of_a_step_are_its_flops_over_its_time_against_each_peak() -> None:
    assert graphed_step.rates("eager_", 2 * 10**12, 0.5, 8e12, 16e12) == {
        "eager_tflops_per_s": 4.0, "eager_mfu": 0.5, "eager_mfu_datasheet": 0.25,
    }  # fmt: skip
    assert graphed_step.rates("", 10**12, 1.0, 2e12, None) == {"tflops_per_s": 1.0, "mfu": 0.5}
    assert graphed_step.rates("", None, 1.0, 2e12, 4e12) == {}  # a model without a FLOP count


def test_the_step_takes_the_checks_batch_for_the_device_unless_one_is_chosen() -> None:
    h200, h100 = 150_754_820_096, 85_045_821_440  # total_memory as torch reports them
    assert graphed_step.with_batch(["x=1"], h200) == ["data.batch_size=16", "x=1"]
    assert graphed_step.with_batch([], h100) == ["data.batch_size=8"]
    assert graphed_step.with_batch(["data.batch_size=4"], h200) == ["data.batch_size=4"]


def test_off_cuda_the_tool_says_so_in_one_line_and_the_measurement_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here")
    assert graphed_step.main([]) == 0
    assert capsys.readouterr().out == (
        "graphed_step: skipped, no CUDA device here (torch.cuda.is_available() is False)\n"
    )
    with pytest.raises(RuntimeError, match="^a CUDA graph needs a CUDA device, not 'cpu'$"):
        graphed_step.measure(TINY, 1.0, torch.device("cpu"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("compiled", [False, True])
def test_the_graphed_cuda_steps_compute_the_eager_steps_losses(compiled: bool) -> None:
    """Without randomness (no dropout, LayerDrop) and with nothing learning (learning rate 0, the codebook's updates
    off), every replayed position gives its eager step's loss: the graphs replay the step on the carried state."""
    config = tiny(
        "trainer=gpu", f"module.compile={str(compiled).lower()}", "model.block.dropout=0.0",
        "model.block.layerdrop=0.0", "model.block.sinusoid_dropout=0.0", "module.lr=0.0",
    )  # fmt: skip
    device = torch.device("cuda")
    stepper = Stepper(config, device)
    stepper.apply = torch.zeros((), dtype=torch.bool, device=device)
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        stepper.sequence()
        stepper.sequence()
    torch.cuda.current_stream(device).wait_stream(side)
    torch.cuda.synchronize(device)
    eager = [x.clone() for x in stepper.losses]
    graphs = graphed_step.capture(stepper)
    for _ in range(2):
        for graph in graphs:
            graph.replay()
    torch.cuda.synchronize(device)
    assert torch.allclose(torch.stack(stepper.losses), torch.stack(eager), rtol=1e-5, atol=1e-6)
