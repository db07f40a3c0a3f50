"""Counting host-device synchronisations: every read of a tensor's value on the host.

On a GPU each ``.item()``, ``.tolist()``, ``.cpu()``, ``.numpy()``, ``bool(t)``, ``float(t)``, ``int(t)`` (and the
``if t:`` they hide) waits for the device to finish its queued work, as does a copy between devices. A CPU run
shows where they are: :class:`HostSyncs` counts them, with the place in the code each came from, whatever device
the tensors are on (on a CPU nothing waits, but the same lines would on a GPU).

What is counted: the aten op ``_local_scalar_dense`` (every read of one value: ``item``, ``bool``, ``float``,
``int``), copies between devices (``_to_copy``/``copy_`` whose source and result devices differ), and calls of
``Tensor.tolist``, ``Tensor.cpu`` and ``Tensor.numpy`` (on a CPU tensor they dispatch nothing, so they are
patched while counting); and the explicit waits of :func:`tvq_exp.measure.timing.sync` (:func:`waited`).

Also counted: the ops whose CUDA kernels read the device themselves (:func:`reads_the_device`). Their reads happen
inside the kernel, below the dispatcher, so on a CPU run no ``_local_scalar_dense`` shows them; the op is counted
instead, by its name and arguments:

- a result whose size depends on the values: ``nonzero`` (and ``torch.where(mask)``, ``argwhere``),
  ``masked_select``, the ``unique`` ops, ``repeat_interleave`` with repeats in a tensor and no ``output_size``;
- indexing by a boolean mask (``x[mask]``: ``index`` expands the mask with ``nonzero``), reading or writing. A
  write of one value from the host (``x[mask] = 0.``) is the exception: ATen takes it as ``masked_fill_``;
- a Python ``bool`` for a result: ``equal``, ``allclose``;
- host checks of the values: ``bincount`` (sizes its result by the largest value), ``histc`` without a range (finds
  the range), ``multinomial`` without replacement or for one draw (checks the probabilities).

A custom op's body (``torch.library.custom_op``: the fused kernels' wrappers) is run by the count under a mode of
its own (:func:`custom_op_body`): a dispatch mode sees none of the ops inside an op it lets through.

A value on the host the same code would hold on a GPU cannot be told from one on the device in a CPU run: a mask
write of a one-element tensor counts as ``masked_fill_`` here, though from a tensor on the GPU it would read it.
"""

from __future__ import annotations

import contextlib
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch._library import custom_ops
from torch.utils._python_dispatch import TorchDispatchMode

PATCHED = ("tolist", "cpu", "numpy")
# a read of one value: ``item`` is what a mode sees inside a custom op's body (where autograd's keys are off, so it
# is not taken apart into ``_local_scalar_dense``)
_SCALARS = (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.item.default)
_COPIES = (torch.ops.aten._to_copy.default, torch.ops.aten.copy_.default)
_aten = torch.ops.aten
# ops whose CUDA kernel reads the device whatever their arguments (the result's size, or a Python bool)
_ALWAYS = {
    _aten.nonzero.default: "nonzero",
    _aten.where.default: "nonzero",  # torch.where(mask), as a custom op's body shows it (else nonzero)
    _aten.argwhere.default: "nonzero",
    _aten.nonzero_numpy.default: "nonzero",
    _aten.is_nonzero.default: "item",
    _aten.masked_select.default: "masked_select",
    _aten._unique.default: "unique",
    _aten._unique2.default: "unique",
    _aten.unique_dim.default: "unique",
    _aten.unique_consecutive.default: "unique",
    _aten.equal.default: "equal",
    _aten.allclose.default: "allclose",
    _aten.bincount.default: "bincount",
}
_REPEATS = (_aten.repeat_interleave.Tensor, _aten.repeat_interleave.self_Tensor)
_MASK_INDEXING = (_aten.index.Tensor, _aten.index_put_.default, _aten._index_put_impl_.default)


def _masks(indices: Any) -> list[torch.Tensor]:
    """The boolean (or byte) masks among an ``index``/``index_put_`` op's indices."""
    return [i for i in indices or () if isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8)]


def _masked_fill(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether ATen runs this ``index_put_`` as ``masked_fill_`` (``canDispatchToMaskedFill``): one mask on the
    tensor's device, the other indices empty, one value on the host, no accumulation."""
    self, indices, value = args[:3]
    accumulate = args[3] if len(args) > 3 else kwargs.get("accumulate", False)
    defined = [i for i in indices if i is not None]
    return (
        not accumulate
        and value.numel() == 1
        and value.device.type == "cpu"
        and len(defined) == 1
        and defined[0].device == self.device
    )


def reads_the_device(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """What an aten op reads from the device inside its CUDA kernel (its name for the count), or ``None`` where
    it reads nothing: see the module docstring for the list."""
    if func in _ALWAYS:
        return _ALWAYS[func]
    if func in _MASK_INDEXING and _masks(args[1]):
        return (
            None if func is not _aten.index.Tensor and _masked_fill(args, kwargs) else "boolean mask indexing"
        )
    if func in _REPEATS and kwargs.get("output_size") is None:
        return "repeat_interleave without output_size"
    if func is _aten.histc.default and _histc_range(args, kwargs) == (0, 0):
        return "histc without a range"
    if func is _aten.multinomial.default:
        samples = args[1] if len(args) > 1 else kwargs["num_samples"]
        replacement = args[2] if len(args) > 2 else kwargs.get("replacement", False)
        return None if replacement and samples > 1 else "multinomial's check of its probabilities"
    return None


def _histc_range(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[float, float]:
    """``histc``'s ``(min, max)``: both 0 (the default) tells it to find them."""
    low = args[2] if len(args) > 2 else kwargs.get("min", 0)
    high = args[3] if len(args) > 3 else kwargs.get("max", 0)
    return low, high


# the count's own frames; any other file is a place (a test's ``test_host_syncs.py`` too)
_SKIPPED = (__file__, contextlib.__file__)


def _place(frame: traceback.FrameSummary) -> str:
    """``file:line function`` of ``frame`` (a package's file from its ``site-packages`` on)."""
    return f"{frame.filename.rsplit('/site-packages/', 1)[-1]}:{frame.lineno} {frame.name}"


def _caller() -> str:
    """The place of the innermost frame outside torch and this module (where the read is)."""
    for frame in reversed(traceback.extract_stack()):
        if "/torch/" not in frame.filename and frame.filename not in _SKIPPED:
            return _place(frame)
    return "?"


def custom_op_body(func: Any, args: tuple[Any, ...]) -> Callable[..., Any] | None:
    """The Python body a ``torch.library.custom_op`` op (such as the fused kernels' ``tvq::...``) runs on its
    operands' device, or ``None`` for any other op. A dispatch mode does not see the ops inside an op it lets
    through (a read of the device in a custom op's wrapper, say), so the count runs such bodies itself."""
    opdef = custom_ops.OPDEFS.get(func.name()) if isinstance(func, torch._ops.OpOverload) else None
    if opdef is None:
        return None
    device = next((x.device.type for x in args if isinstance(x, torch.Tensor)), None)
    return opdef._backend_fns.get(device, opdef._init_fn)


def _devices(args: tuple[Any, ...], out: Any) -> set[torch.device]:
    tensors = [x for x in (*args, out) if isinstance(x, torch.Tensor)]
    return {x.device for x in tensors}


class HostSyncs(TorchDispatchMode):
    """A dispatch mode that records each host read of a tensor value (see the module docstring).

    ``events`` lists ``(kind, place)`` pairs in order; :meth:`by_place` counts them per place.
    Use :func:`counting_syncs` (it also patches the methods that dispatch nothing on a CPU tensor).
    """

    def __init__(self, parent: HostSyncs | None = None) -> None:
        super().__init__()
        self.parent = parent  # a mode counting inside a custom op's body records into the mode around the op
        self.events: list[tuple[str, str]] = []
        self.paused = False

    def record(self, kind: str, place: str | None = None) -> None:
        if self.parent is not None:
            self.parent.record(kind, place)
        elif not self.paused:
            self.events.append((kind, place or _caller()))

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        read = reads_the_device(func, args, kwargs)
        if read is not None:
            self.record(read)
        body = custom_op_body(func, args)
        if body is None:
            out = func(*args, **kwargs)
        else:  # run here, under a mode of its own: a mode sees none of the ops an op it dispatches runs inside
            with HostSyncs(parent=self):
                out = body(*args, **kwargs)
        if func in _SCALARS:
            self.record("item")
        elif func in _COPIES and len(_devices(args, out)) > 1:
            self.record("copy between devices")
        return out

    def by_place(self) -> Counter[str]:
        """How many reads each place made."""
        return Counter(f"{kind} at {place}" for kind, place in self.events)


@contextmanager
def counting_syncs() -> Iterator[HostSyncs]:
    """Count host reads inside the block: ``with counting_syncs() as syncs: ...; syncs.events``."""
    mode = HostSyncs()
    originals = {name: getattr(torch.Tensor, name) for name in PATCHED}

    def patched(name: str) -> Callable[..., Any]:
        original = originals[name]

        def read(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            mode.record(name)
            mode.paused = True  # its own scalar reads are this one read
            try:
                return original(self, *args, **kwargs)
            finally:
                mode.paused = False

        return read

    for name in PATCHED:
        setattr(torch.Tensor, name, patched(name))
    _COUNTING.append(mode)
    try:
        with mode:
            yield mode
    finally:
        _COUNTING.remove(mode)
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)


_COUNTING: list[HostSyncs] = []  # the counts running, innermost last


def waited() -> None:
    """Record an explicit wait for the device (:func:`tvq_exp.measure.timing.sync`) in the innermost count running,
    if any: on a CPU it waits for nothing, and the same line on a GPU waits for everything queued."""
    if _COUNTING:
        _COUNTING[-1].record("synchronize", _place(traceback.extract_stack()[-3]))  # sync's caller


__all__ = ["HostSyncs", "counting_syncs", "reads_the_device", "waited"]
