"""``torch.compile`` of the model and of the training step equals eager on CPU (forward and gradients), without
graph breaks."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch import Tensor
from torch._dynamo.utils import counters

from tests.helpers.config import compose_config
from tvq_exp.attention import build_attention
from tvq_exp.models.blocks import GAUBlock, MHABlock
from tvq_exp.models.decoder import Decoder, ModelState, detach_state
from tvq_exp.models.module import AutoregressiveLitModule
from tvq_exp.models.optim import all_finite


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


def tiny_module(block: str) -> AutoregressiveLitModule:
    """A one-layer ``gau_vq`` / ``mha_vq`` (``S = 16``, ``L = 8``, the XL bias, the cache used from the first call)."""
    torch.manual_seed(0)
    blocks = {"gau": functools.partial(GAUBlock, d_k=16), "mha": functools.partial(MHABlock, heads=2)}
    codebook = {"decay_warmup": 4, "reseed_fraction": 0.5}  # the tensor decay and the re-seeding in the graph
    attention = functools.partial(build_attention, "vq", codebook_size=16, block_len=8, codebook=codebook)
    return AutoregressiveLitModule(Decoder(256, 32, 1, blocks[block], attention).train())


def training_step(module: AutoregressiveLitModule, x: Tensor, state: ModelState | None) -> tuple[Tensor, Any]:
    """The module's step without Lightning: forward and loss, backward, the device verdict, the codebook update."""
    loss, out = module.step_loss(x[:, :-1], x[:, 1:], state)
    (loss + out.aux["loss"]).backward()
    module.codebook_update(all_finite(loss, module.parameters()))
    return loss, out


def step_each(
    modules: tuple[AutoregressiveLitModule, ...],
    x: Tensor,
    states: dict[int, ModelState | None],
    seed: int | None = None,
) -> list[Tensor]:
    """One training step of each module from its carried state ``states[i]`` (replaced by the step's, detached), each
    from torch seed ``seed`` when given: their losses."""
    losses = []
    for i, module in enumerate(modules):
        module.zero_grad()
        if seed is not None:
            torch.manual_seed(seed)
        loss, out = training_step(module, x, states[i])
        states[i] = detach_state(out.state)
        losses.append(loss)
    return losses


@pytest.mark.parametrize("block", ["gau", "mha"])
def test_the_training_step_compiles_without_graph_breaks_and_equals_eager(block: str) -> None:
    """Two steps (a fresh segment, then one continuing its state): forward, loss, the codebook metrics, backward
    and the codebook update, captured whole (``fullgraph=True``; AOTAutograd, the backend that adds nothing to
    the captured graph) against eager: losses, metrics, gradients, codebook buffers and the carried state."""
    torch._dynamo.reset()
    counters.clear()
    eager, compiled = tiny_module(block), tiny_module(block)
    compiled.compile_step(backend="aot_eager", fullgraph=True)
    x = torch.randint(0, 256, (2, 25), generator=torch.Generator().manual_seed(1))
    states: dict[int, ModelState | None] = {0: None, 1: None}
    for _ in range(2):
        results = []
        for i, module in enumerate((eager, compiled)):
            torch.manual_seed(2)  # the re-seeding's draws
            module.zero_grad()
            loss, out = training_step(module, x, states[i])
            states[i] = detach_state(out.state)
            results.append((loss, out))
        (loss_e, out_e), (loss_c, out_c) = results
        torch.testing.assert_close(loss_c, loss_e, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(out_c.aux, out_e.aux, rtol=1e-5, atol=1e-6)
        for (name, p_e), p_c in zip(eager.named_parameters(), compiled.parameters(), strict=True):
            torch.testing.assert_close(p_c.grad, p_e.grad, rtol=1e-5, atol=1e-6, msg=name)
        for (name, b_e), b_c in zip(eager.named_buffers(), compiled.buffers(), strict=True):
            torch.testing.assert_close(b_c, b_e, rtol=1e-5, atol=1e-6, msg=name)
        for s_e, s_c in zip(states[0], states[1], strict=True):
            torch.testing.assert_close(s_c.attn.cache_mu, s_e.attn.cache_mu, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(s_c.attn.k, s_e.attn.k, rtol=1e-5, atol=1e-6)
    assert dict(counters["graph_break"]) == {}
    assert (
        counters["stats"]["unique_graphs"] <= 4
    )  # forward + loss and codebook update; once more with a state


def test_the_gpu_presets_compile_the_training_step_and_the_cpu_presets_do_not() -> None:
    compiled = {
        name: compose_config("train", overrides).module.compile
        for name, overrides in {
            "default": [], "gpu": ["trainer=gpu"], "enwik8_paper": ["experiment=enwik8_paper"],
            "smoke": ["experiment=smoke"], "off": ["trainer=gpu", "module.compile=false"],
        }.items()
    }  # fmt: skip
    assert compiled == {"default": False, "gpu": True, "enwik8_paper": True, "smoke": False, "off": False}
    assert compose_config("train", ["experiment=enwik8_paper"]).module.compile_scope == "blocks"


def twin_vq_stacks(layers: int, **attention: Any) -> tuple[AutoregressiveLitModule, AutoregressiveLitModule]:
    """Two equal modules of ``layers`` small GAU-VQ blocks (``d_model`` 32, ``S`` 16, ``L`` 8; ``attention``: more
    of the VQ layer's options) set to compile by blocks: one to run eager, one to compile."""
    vq = functools.partial(build_attention, "vq", codebook_size=16, block_len=8, **attention)
    return twin_stacks(layers, functools.partial(GAUBlock, d_k=16), vq, "blocks")


def twin_stacks(
    layers: int, block: Callable[..., torch.nn.Module], attention: Callable[..., torch.nn.Module], scope: str
) -> tuple[AutoregressiveLitModule, AutoregressiveLitModule]:
    """Two equal modules of ``layers`` blocks (``d_model`` 32) set to compile ``scope``: one to run eager, one to
    compile."""
    modules = []
    for _ in range(2):
        torch.manual_seed(0)
        modules.append(
            AutoregressiveLitModule(Decoder(256, 32, layers, block, attention).train(), compile_scope=scope)
        )
    return modules[0], modules[1]


def segments(
    eager: AutoregressiveLitModule, compiled: AutoregressiveLitModule, count: int
) -> Iterator[tuple[list[Tensor], dict[int, ModelState | None], int]]:
    """Compile ``compiled``'s step (aot_eager, ``fullgraph=True``) and run ``count`` TBPTT segments of 24 positions
    through both modules, their states carried: after each, the two losses, the states and the compiled frames."""
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")
    compiled.compile_step(backend=counter, fullgraph=True)
    x = torch.randint(0, 256, (2, 25), generator=torch.Generator().manual_seed(1))
    states: dict[int, ModelState | None] = {0: None, 1: None}
    for _ in range(count):
        losses = step_each((eager, compiled), x, states)
        yield losses, states, counter.frame_count


def test_compiling_by_blocks_compiles_one_block_for_the_whole_stack_and_equals_eager() -> None:
    """``compile_scope="blocks"``: three identical blocks share one compiled code (one frame per state shape:
    a fresh segment, then one continuing its state) that each of them runs, their three quantisers one compiled
    update, and the step equals eager: losses, gradients, codebook buffers, the state."""
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    counters.clear()
    eager, compiled = twin_vq_stacks(3)
    counter, runs = CompileCounterWithBackend("aot_eager"), []

    def backend(graph: torch.fx.GraphModule, inputs: list[Tensor]) -> Any:  # counts the compiled code's runs
        compiled_graph = counter(graph, inputs)
        return lambda *args: runs.append(1) or compiled_graph(*args)

    compiled.compile_step(backend=backend, fullgraph=True)
    x = torch.randint(0, 256, (2, 25), generator=torch.Generator().manual_seed(1))
    states: dict[int, ModelState | None] = {0: None, 1: None}
    for step in range(2):
        results = step_each((eager, compiled), x, states)
        torch.testing.assert_close(results[1], results[0], rtol=1e-6, atol=1e-6)
        for (name, p_e), p_c in zip(eager.named_parameters(), compiled.parameters(), strict=True):
            torch.testing.assert_close(p_c.grad, p_e.grad, rtol=1e-5, atol=1e-6, msg=name)
        for (name, b_e), b_c in zip(eager.named_buffers(), compiled.buffers(), strict=True):
            torch.testing.assert_close(b_c, b_e, rtol=1e-5, atol=1e-6, msg=name)
        for s_e, s_c in zip(states[0], states[1], strict=True):
            torch.testing.assert_close(s_c.attn.cache_mu, s_e.attn.cache_mu, rtol=1e-5, atol=1e-6)
        # one code for the three blocks, once per state shape, and one for the three quantisers' updates ...
        assert counter.frame_count == step + 2
        assert len(runs) == 6 * (step + 1)  # ... that every block and every quantiser runs
    assert dict(counters["graph_break"]) == {}


def test_tbptt_segments_after_the_first_reuse_one_compiled_block_and_carry_their_true_positions() -> None:
    """Four TBPTT segments of 24 positions (``L = 8``): the state reaches each block at its equivalent position (16
    for 24, 48, 72), so the blocks' code compiles for the first segment and the second, and no more; the carried
    states keep their true positions, and the steps equal eager's (whose states move too)."""
    frames = []
    for step, (losses, states, frame_count) in enumerate(segments(*twin_vq_stacks(2), 4)):
        for state in states.values():
            assert {(s.position, s.attn.position) for s in state} == {(24 * (step + 1),) * 2}
        torch.testing.assert_close(losses[1], losses[0], rtol=1e-6, atol=1e-6)
        frames.append(frame_count)
    assert frames == [
        2,
        3,
        3,
        3,
    ]  # the blocks' code and the quantisers' update; the blocks' once more with a state


BASELINES = {  # attention, its options, the block's position; the compiled frames after each of six segments
    "flash_chunk": ("flash_chunk", {"group_size": 8}, "xl", [1, 2, 2, 2, 2, 2]),  # at position 0
    "linear_rope": ("linear", {}, "rope", [1, 2, 3, 3, 3, 3]),  # the third: its positions made symbolic
    # at 24, then at 40 (its equivalent position from 40 on: the dictionary's five centroids in use by block 4)
    "ovq": ("ovq", {"num_centroids": 5, "block_len": 8}, "xl", [1, 2, 3, 3, 3, 3]),
}


@pytest.mark.parametrize("scope", ["step", "blocks"])
@pytest.mark.parametrize("baseline", list(BASELINES))
def test_tbptt_segments_of_the_baselines_compile_a_bounded_number_of_times(baseline: str, scope: str) -> None:
    """Six TBPTT segments of 24 positions: FLASH (its state at position 0, its count of positions a tensor), RoPE
    linear attention (rotations at absolute positions: no equivalence; its positions symbolic from their second
    value) and OVQ (its state at its equivalent position once every centroid is in use) compile for the first
    segments, then no more, and train as eager; their states hold no view of a call's tensors. Before, each compiled
    once per segment, then ran eagerly past dynamo's recompile limit (8)."""
    name, options, position, want = BASELINES[baseline]
    block = functools.partial(GAUBlock, d_k=16, position=position)
    eager, compiled = twin_stacks(2, block, functools.partial(build_attention, name, **options), scope)
    frames = []
    for step, (losses, states, frame_count) in enumerate(segments(eager, compiled, 6)):
        torch.testing.assert_close(losses[1], losses[0], rtol=1e-6, atol=1e-6)
        for p_e, p_c in zip(eager.parameters(), compiled.parameters(), strict=True):
            torch.testing.assert_close(p_c.grad, p_e.grad, rtol=1e-5, atol=1e-6)
        assert {s.position for s in states[1]} == {24 * (step + 1)}  # the true positions carried on
        kept = [x for s in states[1] for x in s.attn.tensors()]
        assert all(x.untyped_storage().nbytes() == x.nbytes for x in kept)  # no view of a call's tensors
        frames.append(frame_count)
    assert frames == want


def test_compiled_dense_attention_choosing_its_kernel_keeps_one_graph() -> None:
    """``kernel=auto`` asks at each call whether flex attention can run; asked inside a compiled block, its check of
    TorchDynamo's support was a function dynamo will not trace: a graph break at every call (an error here, under
    ``fullgraph=True``). Four segments of a stream (the carried keys at the memory's 24), equal to eager."""
    dense = functools.partial(build_attention, "dense", window_len=8, memory_len=24, kernel="auto")
    frames = []
    for losses, states, frame_count in segments(
        *twin_stacks(2, functools.partial(GAUBlock, d_k=16), dense, "blocks"), 4
    ):
        torch.testing.assert_close(losses[1], losses[0], rtol=1e-6, atol=1e-6)
        frames.append(frame_count)
        kept = states[1][0].attn.k
        assert kept.is_contiguous() and kept.untyped_storage().nbytes() == kept.nbytes  # its own memory
    # a fresh segment, then the carried keys at the memory's 24: their own memory, one layout whether the call's keys
    # fitted the memory (the first segment's) or outnumbered it (a view of them recompiled on its strides)
    assert frames == [1, 2, 2, 2]


def test_the_moved_states_train_as_the_states_where_they_are() -> None:
    """Eager, four TBPTT segments: the steps with the state moved to its equivalent position give the losses,
    gradients and states of steps that hand it over where it is (the model's equivalence replaced by none)."""
    moving, staying = twin_vq_stacks(2)
    staying.model.equivalent_position = lambda t: t  # type: ignore[method-assign]
    x = torch.randint(
        0, 256, (2, 21), generator=torch.Generator().manual_seed(1)
    )  # 20 positions: not whole blocks
    states: dict[int, ModelState | None] = {0: None, 1: None}
    for _ in range(4):
        results = step_each((moving, staying), x, states, seed=2)
        assert torch.equal(results[0], results[1])
        for p_m, p_s in zip(moving.parameters(), staying.parameters(), strict=True):
            assert torch.equal(p_m.grad, p_s.grad)
        assert states[0] == states[1]
    assert moving.model.equivalent_position(80) == 16


def test_absolute_positions_and_blocks_that_differ_claim_no_equivalent_position() -> None:
    """A decoder with absolute position embeddings, one of RoPE blocks, one whose blocks' equivalences differ (two
    block lengths): each hands its state over where it is; VQ blocks of one block length move it."""
    vq = functools.partial(build_attention, "vq", codebook_size=16)
    gau = functools.partial(GAUBlock, d_k=16)
    rope = functools.partial(GAUBlock, d_k=16, position="rope")
    one_length = Decoder(256, 32, 2, gau, functools.partial(vq, block_len=8))
    embedded = Decoder(
        256, 32, 2, gau, functools.partial(vq, block_len=8), pos_embedding=torch.nn.Embedding(99, 32)
    )
    rotated = Decoder(256, 32, 2, rope, functools.partial(vq, block_len=8))
    two_lengths = Decoder(256, 32, 2, gau, functools.partial(vq, block_len=8))
    two_lengths.blocks[1].attn.block_len = 16
    positions = [model.equivalent_position(88) for model in (one_length, embedded, rotated, two_lengths)]
    assert positions == [16, 88, 88, 88]


def test_compiled_blocks_hold_the_fused_kernel_in_their_graphs(monkeypatch: pytest.MonkeyPatch) -> None:
    """``kernel=triton`` (Triton's interpreter here) inside blocks compiled by ``compile_scope="blocks"``: the fused op
    is one node of each block's graph (``fullgraph=True``, no graph break), and a training step equals the eager one
    (loss and every gradient)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    torch._dynamo.reset()
    counters.clear()
    modules = eager, compiled = twin_vq_stacks(2, kernel="triton")
    compiled.compile_step(backend="aot_eager", fullgraph=True)
    x = torch.randint(0, 256, (2, 25), generator=torch.Generator().manual_seed(1))
    losses = [training_step(module, x, None)[0] for module in modules]
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-6, atol=1e-6)
    assert all(attn.last_kernel == "triton" for attn in compiled.model.attention_modules())
    for (name, p_e), p_c in zip(eager.named_parameters(), compiled.parameters(), strict=True):
        torch.testing.assert_close(p_c.grad, p_e.grad, rtol=1e-5, atol=1e-6, msg=name)
    assert dict(counters["graph_break"]) == {}


@pytest.mark.parametrize("scope", ["step", "blocks"])
def test_the_compile_mode_reaches_the_forward_and_backward_and_not_the_codebook_update(
    scope: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``compile_mode`` is torch.compile's mode for what computes the loss and its gradients (the whole step, or
    each block); the codebook update, which writes its buffers in place, keeps the default mode. With a CUDA graph
    mode the carried state is a copy: it shares no memory with the step's output (a replay overwrites that)."""
    calls: list[tuple[str, str | None]] = []

    def spy(fn: Any, **options: Any) -> Any:  # records what is compiled how, and runs it eager
        calls.append((getattr(fn, "__name__", type(fn).__name__), options.get("mode")))
        return fn

    monkeypatch.setattr(torch, "compile", spy)
    eager, module = twin_vq_stacks(2)
    module.compile_scope, module.compile_mode, module.compile = scope, "reduce-overhead", True
    module.compile_step()
    expected = {  # the blocks' two quantisers' update is one function: made twice, the last kept
        "step": [("training_loss", "reduce-overhead"), ("codebook_step", None)],
        "blocks": [("_call_impl", "reduce-overhead")] * 2 + [("update", None)] * 2,
    }
    assert calls == expected[scope]
    assert module.cuda_graphs() and not eager.cuda_graphs()
    _, out = module.step_loss(*_tokens(), None)
    carried = module.carried(out.state)
    for ours, theirs in zip(carried, out.state, strict=True):
        for a, b in zip(ours.tensors(), theirs.tensors(), strict=True):
            assert torch.equal(a, b) and a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr()
            assert not a.requires_grad


def _tokens() -> tuple[Tensor, Tensor]:
    x = torch.randint(0, 256, (2, 25), generator=torch.Generator().manual_seed(1))
    return x[:, :-1], x[:, 1:]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
def test_cuda_graphs_of_compiled_blocks_train_as_eager_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """``compile_mode=reduce-overhead`` by blocks on a CUDA device (the paper preset's scope): three TBPTT steps of
    a three-block stack, each carrying its state to the next, forward, backward and codebook update replayed from
    CUDA graphs, equal eager's: losses, gradients, codebook buffers (fp32, TF32 off)."""
    torch._dynamo.reset()
    eager, compiled = (m.cuda() for m in twin_vq_stacks(3))
    compiled.compile, compiled.compile_mode = True, "reduce-overhead"
    compiled.compile_step()
    x = torch.randint(0, 256, (2, 25), generator=torch.Generator().manual_seed(1)).cuda()
    states: dict[int, ModelState | None] = {0: None, 1: None}
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)  # (it has no flags() context)
    with torch.backends.cudnn.flags(allow_tf32=False):
        for _ in range(3):
            losses = []
            for i, module in enumerate((eager, compiled)):
                module.zero_grad(set_to_none=True)
                module.start_step()
                loss, out = training_step(module, x, states[i])
                states[i] = module.carried(out.state)
                losses.append(loss.item())
            assert losses[1] == pytest.approx(losses[0], rel=1e-5)
            for (name, p_e), p_c in zip(eager.named_parameters(), compiled.parameters(), strict=True):
                torch.testing.assert_close(p_c.grad, p_e.grad, rtol=1e-4, atol=1e-5, msg=name)
            for (name, b_e), b_c in zip(eager.named_buffers(), compiled.buffers(), strict=True):
                torch.testing.assert_close(b_c, b_e, rtol=1e-4, atol=1e-5, msg=name)


def test_evaluation_hands_its_state_to_the_compiled_blocks_at_the_equivalent_position() -> None:
    """``compile_scope=blocks`` (the paper preset) runs the compiled blocks in evaluation too, where the ``sequence``
    protocol carries the state over a sequence's segments: they reach the blocks at their equivalent positions (one
    compile for all segments after the first, not one each), their bits equal eager's, and the carried states keep
    their true positions."""
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    eager, compiled = twin_vq_stacks(2)
    counter = CompileCounterWithBackend("aot_eager")
    compiled.compile_step(backend=counter, fullgraph=True)
    x = torch.randint(0, 256, (2, 25), generator=torch.Generator().manual_seed(1))
    batch = {"input": x[:, :-1], "target": x[:, 1:], "reset": torch.zeros(2, dtype=torch.bool)}
    frames = []
    for module in (eager, compiled):
        module.eval()
        module.eval_stage = lambda: "val"  # type: ignore[method-assign]  (no trainer attached)
    with torch.no_grad():
        for step in range(4):
            for module in (eager, compiled):
                module.validation_step(batch, step)
                assert {(s.position, s.attn.position) for s in module.eval_state} == {(24 * (step + 1),) * 2}
            frames.append(counter.frame_count)
    assert frames == [1, 2, 2, 2]  # the blocks' code without a state, then once with one
    bits = [module.eval_bits["val"].compute()["loss"] for module in (eager, compiled)]
    assert bits[1] == pytest.approx(bits[0], rel=1e-6)
