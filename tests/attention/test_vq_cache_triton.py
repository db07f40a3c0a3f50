"""The cache's running code means in Triton (``tvq_exp.attention.vq.fused.prefix``), run on CPU under Triton's
interpreter (and compiled on CUDA where there is one): equal to the plain reference
(:func:`tvq_exp.attention.vq.cache.cache_means`: the running means, the entries the items read in the values' dtype,
the state's entry in fp32), counts exactly, means and the values' gradient in fp32 within 1e-6; with bf16 values as
the reference with the same values; values read where they lie (a multi-head projection's strides: no copy) and their
gradient written dense in their dim order, its fake (what ``torch.compile`` allocates) alike; refused in one line
where it cannot run."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch._dynamo.utils import counters

from tests.attention.backends import build
from tests.attention.test_vq_triton import DEVICES, interpreter  # noqa: F401  (the fixture: under the interpreter)
from tvq_exp.attention.vq.cache import CacheMeans, cache_means
from tvq_exp.attention.vq.fused import prefix
from tvq_exp.attention.vq.fused.prefix import fused_cache_means, why_not
from tvq_exp.attention.vq.fused.support import dense_like

TOL = 1e-6  # relative error (‖got - want‖ / ‖want‖) in fp32


def make_inputs(  # noqa: ANN201
    n: int,
    r: int,
    length: int,
    s: int,
    d: int,
    pad: int,
    device: str,
    dtype: torch.dtype,
    used: int | None = None,
):
    """Codes over every code (some twice per block; over the first ``used`` codes where given), values, the last
    ``pad`` positions padded, and a carried state with some codes empty."""
    codes = torch.randint(0, s if used is None else used, (n, r, length), device=device)
    values = torch.randn(n, r, length, d, device=device).to(dtype).requires_grad_()
    valid = torch.ones(r, length, dtype=torch.bool, device=device)
    if pad:
        valid[-1, -pad:] = False
    n0 = torch.randint(0, 3, (n, s), device=device).double()
    mu0 = torch.randn(n, s, d, device=device) * (n0 > 0)[..., None]
    return codes, values, valid, n0, mu0


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.detach().double(), want.detach().double()
    return float((got - want).norm() / want.norm())


CASES = {
    # 70 codes, positions and columns: five tiles of each under the interpreter (16 wide), the last partial
    "several tiles of codes, positions and columns, padded": dict(n=2, r=3, length=70, s=70, d=70, pad=5),
    "one block, no padding": dict(n=1, r=1, length=16, s=20, d=16, pad=0),
    "many blocks": dict(n=1, r=9, length=16, s=16, d=16, pad=3),
    # a collapsing codebook: every position's code in the first tile of 16 (one run of the sorted codes holds them
    # all, the other tiles' runs are empty), the run crossing many steps of positions and of counted codes
    "every position in one code tile": dict(n=2, r=2, length=70, s=70, d=20, pad=7, used=5),
}
# the items (first block, how many) and the state's entry, of R blocks: from block 0 (blocks 0 and 1 both read entry
# 0), from a later block, and the last block alone, as a decoding step reads them
READS = {
    "every block, the last entry kept": lambda r: (0, r, r),
    "from block 1, an inner entry kept": lambda r: (min(1, r - 1), r - min(1, r - 1), r // 2),
    "the last block, entry 0 kept": lambda r: (r - 1, 1, 0),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reads", READS.values(), ids=READS.keys())
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_fused_code_means_equal_the_reference_fp32(case: dict, reads: object, device: str) -> None:
    check_against_the_reference(case, device, *reads(case["r"]))


def test_the_gpu_tiles_equal_the_reference_under_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU's tiles (:data:`~tvq_exp.attention.vq.fused.prefix.GPU_TILES`: a block's sums 64 codes × 64
    columns, 32 positions and 256 sorted codes a step, the walks 32 × 64, the code rows 64 positions × 64 columns)
    under the interpreter, across their edges: 300 codes, 600 positions a block, 70 columns."""
    monkeypatch.setattr(prefix, "kernel_tiles", lambda interpret, kernel: prefix.GPU_TILES[kernel])
    monkeypatch.setitem(prefix.RUN_STEP, True, prefix.RUN_STEP[False])
    check_against_the_reference(dict(n=1, r=3, length=600, s=300, d=70, pad=30), "cpu", 0, 3, 2)


def check_against_the_reference(case: dict, device: str, first: int, items: int, state: int) -> None:
    """The fused means of ``case`` (:func:`make_inputs`' sizes; ``items`` items from block ``first``, entry ``state``
    kept) equal the reference: counts exactly, the items' and the state's means and the values' gradient within
    :data:`TOL` in fp32; the padding takes no gradient."""
    torch.manual_seed(0)
    inputs = make_inputs(**case, device=device, dtype=torch.float32)
    got = fused_cache_means(*inputs, first, items, state)
    want = cache_means(*inputs, first, items, state)
    assert isinstance(got, CacheMeans) and got.counts.dtype == torch.float64
    assert torch.equal(got.counts, want.counts)  # exact counts
    assert got.items.shape == want.items.shape == (case["n"], items, case["s"], case["d"])
    assert got.items.dtype == got.state.dtype == torch.float32 and not got.state.requires_grad
    assert rel_err(got.items, want.items) <= TOL and rel_err(got.state, want.state) <= TOL
    values, valid = inputs[1], inputs[2]
    g = torch.randn_like(want.items)
    (dv_got,) = torch.autograd.grad((got.items * g).sum(), values)
    (dv_want,) = torch.autograd.grad((want.items * g).sum(), values)
    if first + items <= 2:  # blocks 0 and 1 read entry 0 alone, the carried state: no value reaches them
        assert not dv_got.any() and not dv_want.any()
    else:
        assert dv_want.any() and rel_err(dv_got, dv_want) <= TOL
    assert (dv_got[:, -1][:, ~valid[-1]] == 0).all()  # padding takes no gradient


@pytest.mark.parametrize("device", DEVICES)
def test_fused_code_means_of_bf16_values_equal_the_reference(device: str) -> None:
    """bf16 values: the products are exact and the sums fp32, as the reference's (which widens them first)."""
    torch.manual_seed(1)
    inputs = make_inputs(2, 3, 40, 24, 32, 4, device, torch.bfloat16)
    got, want = fused_cache_means(*inputs, 0, 3, 3), cache_means(*inputs, 0, 3, 3)
    assert torch.equal(got.counts, want.counts) and rel_err(got.state, want.state) <= TOL
    # the items' means written in bf16 (the reference casts its fp32 means; the interpreter's cast truncates)
    assert got.items.dtype == torch.bfloat16 and rel_err(got.items, want.items) <= 1e-2
    g = torch.randn_like(want.items)
    (dv_got,) = torch.autograd.grad((got.items * g).sum(), inputs[1])
    (dv_want,) = torch.autograd.grad((want.items * g).sum(), inputs[1])
    assert dv_got.dtype == torch.bfloat16 and rel_err(dv_got, dv_want) <= 1e-2


# ----------------------------------------------------------------------------- values where they lie

# values as a layer may hand them, views of a leaf (``b`` sequences of ``h`` heads, ``r`` blocks of ``length``
# positions, ``d`` columns), and whether the kernels read them in place (their blocks cut from one time axis)
LAYOUTS: dict[str, tuple[Callable[..., torch.Tensor], bool]] = {
    # a multi-head projection's (B, T, H, d) seen as (B, H, T, d), cut into blocks
    "(B, T, H, d) as (B, H, R, L, d)": (
        lambda b, h, r, length, d: (
            torch.randn(b, r * length, h, d).requires_grad_().transpose(1, 2).unflatten(2, (r, length))
        ),
        True,
    ),
    # one head a sequence, the sequences interleaved: (T, N, d) seen as (N, T, d)
    "(T, N, d) as (N, R, L, d)": (
        lambda b, h, r, length, d: (
            torch.randn(r * length, b * h, d).requires_grad_().transpose(0, 1).unflatten(1, (r, length))
        ),
        True,
    ),
    # the last r of r + 1 blocks: not dense (a block apart between the sequences)
    "the last blocks of (B, H, R + 1, L, d)": (
        lambda b, h, r, length, d: torch.randn(b, h, r + 1, length, d).requires_grad_()[:, :, 1:],
        True,
    ),
    # positions outside blocks, (N, L, R, d) seen as (N, R, L, d): not one time axis, the kernels read a copy and
    # write the gradient contiguous
    "(N, L, R, d) as (N, R, L, d)": (
        lambda b, h, r, length, d: torch.randn(b * h, length, r, d).requires_grad_().transpose(1, 2),
        False,
    ),
}


def strided_inputs(layout: tuple, b: int, h: int, r: int, length: int, s: int, d: int, pad: int):  # noqa: ANN201
    """:func:`make_inputs` of ``b·h`` sequences (fp32, CPU), the values in ``layout`` (:data:`LAYOUTS`)."""
    codes, _, valid, n0, mu0 = make_inputs(b * h, r, length, s, d, pad, "cpu", torch.float32)
    return codes, layout[0](b, h, r, length, d), valid, n0, mu0


def gradient_strides(values: torch.Tensor, in_place: bool) -> tuple[int, ...]:
    """The strides of the values' gradient: dense in the values' dim order (``torch.empty_like``'s, dense values or
    not), contiguous where the kernels read a copy."""
    return (torch.empty_like(values) if in_place else torch.empty(values.shape)).stride()


@pytest.mark.parametrize("layout", LAYOUTS.values(), ids=LAYOUTS.keys())
def test_fused_code_means_of_strided_values_equal_the_reference(layout: tuple) -> None:
    """Values at a layer's strides (2 sequences of 3 heads, 3 blocks of 20 positions, 20 codes and columns, padded):
    the fused means and the values' gradient equal the reference's of the same values made contiguous
    ``(B·H, R, L, d)``, within :data:`TOL` in fp32; the gradient has the values' shape, dense in their dim order."""
    torch.manual_seed(5)
    b, h, r, length, s, d = 2, 3, 3, 20, 20, 20
    codes, values, valid, n0, mu0 = strided_inputs(layout, b, h, r, length, s, d, pad=3)
    assert not values.is_contiguous()
    got = fused_cache_means(codes, values, valid, n0, mu0, 0, r, r)
    want = cache_means(codes, values.reshape(b * h, r, length, d).contiguous(), valid, n0, mu0, 0, r, r)
    assert torch.equal(got.counts, want.counts)
    assert got.items.shape == want.items.shape == (b * h, r, s, d)
    assert rel_err(got.items, want.items) <= TOL and rel_err(got.state, want.state) <= TOL
    g = torch.randn_like(want.items)
    (dv_got,) = torch.autograd.grad((got.items * g).sum(), values)
    (dv_want,) = torch.autograd.grad((want.items * g).sum(), values)
    assert dv_want.any() and rel_err(dv_got, dv_want) <= TOL
    assert dv_got.shape == values.shape and dv_got.stride() == gradient_strides(values, layout[1])


class _Recording:
    """The prefix kernels' module, its kernels' launches recording their arguments in ``seen`` (by kernel name)."""

    def __init__(self, module: object, seen: dict[str, tuple]) -> None:
        self.module, self.seen = module, seen

    def __getattr__(self, name: str) -> object:
        kernel = getattr(self.module, name)
        return _RecordedKernel(kernel, name, self.seen) if name.endswith("_kernel") else kernel


class _RecordedKernel:
    def __init__(self, kernel: object, name: str, seen: dict[str, tuple]) -> None:
        self.kernel, self.name, self.seen = kernel, name, seen

    def __getitem__(self, grid: tuple) -> Callable[..., object]:
        def launch(*args: object, **kwargs: object) -> object:
            self.seen[self.name] = args
            return self.kernel[grid](*args, **kwargs)

        return launch


IN_PLACE = {name: layout for name, layout in LAYOUTS.items() if layout[1]}


@pytest.mark.parametrize("layout", IN_PLACE.values(), ids=IN_PLACE.keys())
def test_the_kernels_read_strided_values_and_write_their_gradient_in_place(
    layout: tuple, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No copy of values whose blocks are cut from one time axis: the block sums read the op's values themselves
    (their memory at their strides), and the code rows write the gradient autograd hands back."""
    seen: dict[str, tuple] = {}
    kernels = prefix.prefix_kernels
    monkeypatch.setattr(prefix, "prefix_kernels", lambda interpret: _Recording(kernels(interpret), seen))
    torch.manual_seed(6)
    codes, values, valid, n0, mu0 = strided_inputs(layout, 2, 3, 2, 8, 8, 8, pad=0)
    got = fused_cache_means(codes, values, valid, n0, mu0, 0, 2, 2)
    (dv,) = torch.autograd.grad((got.items * torch.randn_like(got.items)).sum(), values)
    read, written = seen["block_sums_kernel"][2], seen["code_rows_kernel"][2]
    assert read.data_ptr() == values.data_ptr() and read.stride() == values.stride()
    assert written.data_ptr() == dv.data_ptr() and dv.stride() == gradient_strides(values, True)


@pytest.mark.parametrize("layout", LAYOUTS.values(), ids=LAYOUTS.keys())
def test_the_ops_fakes_have_the_real_results_strides(layout: tuple) -> None:
    """``torch.compile`` allocates what a custom op's fake returns: the values' gradient's fake has the real one's
    shape and strides (dense in the values' dim order, or contiguous), and ``opcheck`` holds both ops' fakes and
    the forward's autograd registration consistent on strided values."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    torch.manual_seed(7)
    codes, values, _valid, n0, mu0 = strided_inputs(layout, 2, 3, 2, 8, 8, 8, pad=0)
    forward = (codes.to(torch.int32), values, n0, mu0, 0, 2, 2)
    counts, items, _state = prefix.code_means(*forward)
    backward = (
        torch.randn_like(items),
        forward[0],
        counts,
        0,
        values.dtype,
        list(values.shape),
        list(values.stride()),
    )
    real = prefix.code_means_backward(*backward)
    with FakeTensorMode() as mode:
        fake = prefix.code_means_backward(
            *(mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in backward)
        )
    assert fake.shape == real.shape == values.shape
    assert fake.stride() == real.stride() == gradient_strides(values, layout[1])
    torch.library.opcheck(torch.ops.tvq.code_means.default, forward)
    torch.library.opcheck(
        torch.ops.tvq.code_means_backward.default, backward, test_utils=("test_schema", "test_faketensor")
    )


def test_the_compiled_means_of_a_projections_values_equal_eager() -> None:
    """``torch.compile`` (``aot_eager``, one graph) of the fused means of ``(B, T, H, d)`` values seen as
    ``(B, H, R, L, d)``: the eager means and values' gradient bit for bit (the backward's fake strides are the
    kernels')."""
    torch.manual_seed(8)
    codes, values, valid, n0, mu0 = strided_inputs(
        LAYOUTS["(B, T, H, d) as (B, H, R, L, d)"], 2, 3, 2, 8, 8, 8, 0
    )

    def step(values: torch.Tensor) -> torch.Tensor:
        return fused_cache_means(codes, values, valid, n0, mu0, 0, 2, 2).items

    want = step(values)
    g = torch.randn_like(want)
    (dv_want,) = torch.autograd.grad((want * g).sum(), values)
    torch._dynamo.reset()
    counters.clear()
    got = torch.compile(step, backend="aot_eager", fullgraph=True)(values)
    (dv_got,) = torch.autograd.grad((got * g).sum(), values)
    assert dict(counters["graph_break"]) == {}
    assert torch.equal(got, want) and torch.equal(dv_got, dv_want) and dv_got.stride() == dv_want.stride()


def test_dense_like_keeps_the_dim_order() -> None:
    """:func:`~tvq_exp.attention.vq.fused.support.dense_like`: ``torch.empty_like``'s strides at the same width for
    tensors of contiguous rows (dense in their dim order, dense or not), and that order at another width and dtype."""
    x = torch.empty(2, 12, 3, 8).transpose(1, 2)  # (B, H, T, d) of a (B, T, H, d) projection
    for y in (x, x[:, :, 2:], x.unflatten(2, (3, 4))[:, :, 1:], torch.empty(4, 6, 5)[:, 1:].transpose(0, 1)):
        assert dense_like(y, y.shape[-1]).stride() == torch.empty_like(y).stride()
    other = dense_like(x[:, :, 2:], 5, torch.bfloat16)
    assert (
        other.shape == (2, 3, 10, 5) and other.stride() == (150, 5, 15, 1) and other.dtype == torch.bfloat16
    )


def test_fused_code_means_are_refused_in_one_line_without_the_interpreter_on_cpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TRITON_INTERPRET")
    inputs = make_inputs(1, 1, 16, 16, 16, 0, "cpu", torch.float32)
    with pytest.raises(ValueError, match="running code means in Triton: .*TRITON_INTERPRET=1"):
        fused_cache_means(*inputs, 0, 1, 1)


# ----------------------------------------------------------------------------- where the layer takes it


@pytest.mark.parametrize(
    ("kernel", "device", "chosen"),
    [
        ("triton", "cpu", "triton"),  # under the interpreter (this module's fixture)
        ("plain", "cpu", "plain"),
        ("auto", "cpu", "plain"),
        (
            "auto",
            "cuda",
            "triton",
        ),  # at the GAU's 1536 columns too: one product per block, nothing recomputed
        ("plain", "cuda", "plain"),
    ],
)
def test_the_layer_takes_the_fused_means_with_the_fused_kernels(
    kernel: str, device: str, chosen: str
) -> None:
    """The layer's choice (:meth:`means_kernel`) on fake CUDA tensors where named: ``triton``, or ``auto`` on CUDA."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    layer = build("vq", d_k=8, d_v=1536, heads=1, codebook_size=16, block_len=16, kernel=kernel)
    with FakeTensorMode(allow_non_fake_inputs=True):
        values = torch.empty(2, 3, 16, 1536, device=device, dtype=torch.bfloat16)  # (B·Hk, R, L, d_v)
        assert layer.means_kernel(values) == chosen


def test_means_past_the_kernels_int32_offsets_are_refused_in_one_line() -> None:
    """2**31 cache means (8 sequences of 64 blocks, 8192 codes of 512 columns): the layer keeps the plain path."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        values = torch.empty(8, 63, 16, 512, device="cuda", dtype=torch.bfloat16)
        assert (
            why_not(values, 8192)
            == f"{8 * 64 * 8192 * 512} elements; the kernels' offsets are int32 (< 2**31)"
        )
        assert why_not(values, 512) is None


def test_strided_values_are_refused_by_their_extent_not_their_size() -> None:
    """``(B, H, R, L, d)`` values are taken as ``(B·H, R, L, d)`` ones; a few blocks of a long projection
    ``(B, T, H, d)`` whose last element lies past 2**31 (the kernels' offsets reach it) are refused though small."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        values = torch.empty(2, 2**23, 2, 128, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
        few = values[:, :, :64].unflatten(2, (4, 16))  # (2, 2, 4, 16, 128)
        extent = 1 + 2**23 * 256 + 128 + 63 * 256 + 127
        assert few.numel() == 2**15 and extent > 2**31
        assert why_not(few, 16) == f"{extent} elements; the kernels' offsets are int32 (< 2**31)"
        assert why_not(values[:1, :, :64].unflatten(2, (4, 16)), 16) is None


def test_the_layer_computes_its_cache_with_the_kernel_it_chose(monkeypatch: pytest.MonkeyPatch) -> None:
    """``kernel=triton`` (under the interpreter): the layer's cache means come from the fused op, and its output
    equals ``kernel=plain``'s, whose means come from the reference."""
    from tvq_exp.attention.vq import layer as vq_layer

    calls = []
    fused = vq_layer.fused_cache_means
    monkeypatch.setattr(vq_layer, "fused_cache_means", lambda *a: calls.append(1) or fused(*a))
    opts = dict(d_k=8, d_v=8, heads=2, codebook_size=6, block_len=4)
    plain, triton = build("vq", **opts).float(), build("vq", kernel="triton", **opts).float()
    triton.load_state_dict(plain.state_dict())
    q, k, v = (torch.randn(1, 2, 13, 8) for _ in range(3))
    want = plain(q, k, v)[0]
    assert not calls
    got = triton(q, k, v)[0]
    assert calls == [1] and rel_err(got, want) <= 1e-5


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_layer_hands_every_kernel_the_means_in_the_values_dtype(
    monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype
) -> None:
    """The plain path (``kernel=plain``): the running means are fp32 (fp64-accumulated); the kernels' products take
    them in the values' dtype, so ``cache_means`` casts them as it joins the cache entries of the layer's items (a
    bf16 join, half the bytes of an fp32 one). The fused path writes them in that dtype (the test below)."""
    from tvq_exp.attention.vq import layer as vq_layer

    seen = []
    plain = vq_layer.window_cache_attention
    monkeypatch.setattr(
        vq_layer, "window_cache_attention", lambda inputs, **kw: seen.append(inputs) or plain(inputs, **kw)
    )
    layer = build("vq", d_k=8, d_v=8, heads=2, codebook_size=6, block_len=4)
    q, k, v = (torch.randn(1, 2, 16, 8, dtype=dtype) for _ in range(3))
    layer.to(dtype)(q, k, v)
    (inputs,) = seen
    assert inputs.cache.mu.dtype == dtype and inputs.cache.log_n.dtype == torch.float32


def test_the_fused_layer_hands_the_kernels_the_means_as_the_fused_op_wrote_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``kernel=triton``, bf16 (under the interpreter): the cache means the fused kernels read are the fused op's
    items' means themselves, written once in bf16 where the items read them (no join, no cast of the whole prefix),
    and the op's backward takes their gradient as it comes: bf16, the items' size."""
    from tvq_exp.attention.vq import layer as vq_layer

    made, seen, grads = [], [], []
    fused, attend, backward = (
        vq_layer.fused_cache_means, vq_layer.fused_window_cache_attention, prefix.code_means_backward,
    )  # fmt: skip
    monkeypatch.setattr(vq_layer, "fused_cache_means", lambda *a: made.append(fused(*a)) or made[-1])
    monkeypatch.setattr(
        vq_layer,
        "fused_window_cache_attention",
        lambda inputs, **kw: seen.append(inputs) or attend(inputs, **kw),
    )
    monkeypatch.setattr(prefix, "code_means_backward", lambda g, *a: grads.append(g) or backward(g, *a))
    layer = build("vq", d_k=16, d_v=16, heads=1, codebook_size=8, block_len=16, kernel="triton").to(
        torch.bfloat16
    )
    q, k, v = (torch.randn(1, 1, 64, 16, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    layer(q, k, v)[0].float().sum().backward()
    (means,), (inputs,), (grad,) = made, seen, grads
    assert inputs.cache.mu is means.items and means.items.shape == (1, 4, 8, 16)  # 4 blocks, each its entry
    assert means.items.dtype == grad.dtype == torch.bfloat16 and grad.shape == means.items.shape
    assert v.grad.abs().sum() > 0
