"""The fused window + cache step under ``torch.compile`` (Triton's interpreter on CPU): its forward and backward are
custom ops (``tvq::window_cache_forward``, ``tvq::window_cache_backward``), so a compiled function calling
:func:`~tvq_exp.attention.vq.fused.fused_window_cache_attention` is one graph, forward and backward (no graph break,
each op once in its graph), and gives the eager op's output and every input gradient exactly (and the plain
kernel's within 1e-5); ``opcheck`` holds the ops' registrations (schema, fake shapes, autograd) consistent."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.backends.debugging import boxed_nop
from torch._dynamo.utils import counters

from tests.attention.test_vq_triton import TOL, Case, grouped, make_inputs, rel_err, window
from tvq_exp.attention.vq.fused import fused_window_cache_attention
from tvq_exp.attention.vq.fused.op import window_arguments
from tvq_exp.attention.vq.kernel import window_cache_attention

CASES = {
    "bias+cache, 2 heads": Case(),
    "per-item codebook, no gradient to the previous block": Case(per_item_codes=True, prev_grad=False),
    "bias, no cache, 3 of 4 rows": Case(cache=False, rows=3),
}


@pytest.fixture(autouse=True)
def interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def recording_aot_eager(graphs: dict[str, list[torch.fx.GraphModule]]):  # noqa: ANN201
    """``aot_eager`` (AOTAutograd, graphs run as traced) that keeps its forward and backward graphs."""

    def keep(kind: str):  # noqa: ANN202
        def compiler(gm: torch.fx.GraphModule, example_inputs: list) -> object:
            graphs[kind].append(gm)
            return boxed_nop(gm, example_inputs)

        return compiler

    return aot_autograd(fw_compiler=keep("forward"), bw_compiler=keep("backward"))


def op_calls(gm: torch.fx.GraphModule) -> list[str]:
    return [
        str(node.target)
        for node in gm.graph.nodes
        if node.op == "call_function" and "tvq." in str(node.target)
    ]


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_compiled_fused_op_is_one_graph_and_equals_eager(case: Case) -> None:
    torch.manual_seed(0)
    inputs = make_inputs(case)
    names = [k for k, x in inputs.items() if x.requires_grad]

    def step(inp: dict[str, torch.Tensor]) -> torch.Tensor:
        return fused_window_cache_attention(grouped(inp, case), prev_grad=case.prev_grad)

    out = step(inputs)
    g = torch.randn_like(out)
    grads = torch.autograd.grad((out * g).sum(), [inputs[k] for k in names])

    torch._dynamo.reset()
    counters.clear()
    graphs: dict[str, list[torch.fx.GraphModule]] = {"forward": [], "backward": []}
    compiled = torch.compile(step, backend=recording_aot_eager(graphs), fullgraph=True)
    got = compiled(inputs)
    got_grads = torch.autograd.grad((got * g).sum(), [inputs[k] for k in names])

    assert dict(counters["graph_break"]) == {}
    assert [op_calls(gm) for gm in graphs["forward"]] == [["tvq.window_cache_forward.default"]]
    assert [op_calls(gm) for gm in graphs["backward"]] == [["tvq.window_cache_backward.default"]]
    assert torch.equal(got, out)  # the same kernels on the same operands: bit for bit
    for name, got_g, want_g in zip(names, got_grads, grads, strict=True):
        assert want_g.abs().sum() > 0, name  # every input really receives a gradient
        assert torch.equal(got_g, want_g), name
    # and the plain kernel's result (the ops compute the step itself, not only the same as eager)
    plain = window_cache_attention(grouped(inputs, case), prev_grad=case.prev_grad)
    plain_grads = torch.autograd.grad((plain * g).sum(), [inputs[k] for k in names])
    assert rel_err(got, plain) <= TOL
    for name, got_g, want_g in zip(names, got_grads, plain_grads, strict=True):
        assert rel_err(got_g, want_g) <= TOL, name


def test_compiled_fused_op_keeps_the_aot_eager_graph_whole() -> None:
    """The plain ``aot_eager`` backend, ``fullgraph=True``: one graph, no break, the eager output."""
    case = Case()
    torch.manual_seed(3)
    inputs = make_inputs(case)
    step = lambda inp: fused_window_cache_attention(grouped(inp, case))  # noqa: E731
    torch._dynamo.reset()
    counters.clear()
    got = torch.compile(step, backend="aot_eager", fullgraph=True)(inputs)
    assert dict(counters["graph_break"]) == {}
    assert counters["stats"]["unique_graphs"] == 1
    assert torch.equal(got, step(inputs))


def test_fused_ops_pass_opcheck() -> None:
    """``torch.library.opcheck``: schema, fake tensors, autograd registration and AOT dispatch of the forward op
    (bias, per-item codebook), and the backward op's schema and fake tensors."""
    case = Case(per_item_codes=True, items=2, n=1)
    torch.manual_seed(4)
    x = make_inputs(case)
    n, items, rows, d_k = x["q"].shape
    bq = x["bias_q"].reshape(n, items, case.g, -1, d_k)
    dl = (bq @ x["rel"][:, None].transpose(-1, -2)).reshape(n, items, rows, -1).detach().requires_grad_()
    win = window_arguments(window(case))
    q, kb, vb = _ops_layout(x["q"], x["kb"], x["vb"], case)
    args = (q, kb, vb, win, dl, x["codebook"], x["log_n"], x["mu"], True, True)
    torch.library.opcheck(torch.ops.tvq.window_cache_forward.default, args)
    out, lse = torch.ops.tvq.window_cache_forward(*args)
    back = (torch.randn_like(out), *(a.detach() if isinstance(a, torch.Tensor) else a for a in args[:8]))
    back += (out.detach(), lse, True, True, [True, True, False, True, True, True])
    torch.library.opcheck(
        torch.ops.tvq.window_cache_backward.default, back, test_utils=("test_schema", "test_faketensor")
    )


def _ops_layout(q: torch.Tensor, kb: torch.Tensor, vb: torch.Tensor, case: Case) -> tuple[torch.Tensor, ...]:
    """The ops' shapes of flat inputs (views): ``q (N, 1, I, G, Lq, d_k)``, ``kb, vb (N, 1, IB, L, ·)``."""
    return q.unflatten(2, (case.g, case.rows)).unsqueeze(1), kb.unsqueeze(1), vb.unsqueeze(1)


def _heads_interleaved(x: torch.Tensor) -> torch.Tensor:
    """``x`` (N, I, R, d) with the same values laid out ``(I, R, N, d)``: how a ``(B, T, H, d)`` projection of one
    sequence looks seen as ``(B·H, I, R, d)`` (the GPU check's 128k case, ``B·H`` = 4, failed on this under
    inductor: the backward's fake gradients kept the inputs' strides, the kernels write them contiguous)."""
    return x.detach().permute(1, 2, 0, 3).contiguous().permute(2, 0, 1, 3)


def test_fused_ops_pass_opcheck_on_inputs_of_interleaved_heads() -> None:
    case = Case(per_item_codes=True, items=2, n=2)
    torch.manual_seed(4)
    x = make_inputs(case)
    q, kb, vb = _ops_layout(*(_heads_interleaved(x[name]) for name in ("q", "kb", "vb")), case)
    assert not q.is_contiguous()
    win = window_arguments(window(case))
    args = (q, kb, vb, win, None, x["codebook"].detach(), x["log_n"], _heads_interleaved(x["mu"]), True, True)
    torch.library.opcheck(torch.ops.tvq.window_cache_forward.default, args, test_utils=("test_faketensor",))
    out, lse = torch.ops.tvq.window_cache_forward(*args)
    back = (torch.randn_like(out), *args[:8], out, lse, True, True, [True, True, True, False, True, True])
    torch.library.opcheck(torch.ops.tvq.window_cache_backward.default, back, test_utils=("test_faketensor",))
