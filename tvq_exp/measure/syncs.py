"""Counting host-device synchronisations: every read of a tensor's value on the host.

On a GPU each ``.item()``, ``.tolist()``, ``.cpu()``, ``.numpy()``, ``bool(t)``, ``float(t)``, ``int(t)`` (and the
``if t:`` they hide) waits for the device to finish its queued work, as does a copy between devices. A CPU run
shows where they are: :class:`HostSyncs` counts them, with the place in the code each came from, whatever device
the tensors are on (on a CPU nothing waits, but the same lines would on a GPU).

What is counted: the aten op ``_local_scalar_dense`` (every read of one value: ``item``, ``bool``, ``float``,
``int``), copies between devices (``_to_copy``/``copy_`` whose source and result devices differ), and calls of
``Tensor.tolist``, ``Tensor.cpu`` and ``Tensor.numpy`` (on a CPU tensor they dispatch nothing, so they are
patched while counting).
"""

from __future__ import annotations

import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

PATCHED = ("tolist", "cpu", "numpy")
_SCALAR = torch.ops.aten._local_scalar_dense.default
_COPIES = (torch.ops.aten._to_copy.default, torch.ops.aten.copy_.default)


def _caller() -> str:
    """``file:line function`` of the innermost frame outside torch and this module (where the read is)."""
    for frame in reversed(traceback.extract_stack()):
        name = frame.filename
        if "/torch/" not in name and not name.endswith(("syncs.py", "contextlib.py")):
            return f"{name.rsplit('/site-packages/', 1)[-1]}:{frame.lineno} {frame.name}"
    return "?"


def _devices(args: tuple[Any, ...], out: Any) -> set[torch.device]:
    tensors = [x for x in (*args, out) if isinstance(x, torch.Tensor)]
    return {x.device for x in tensors}


class HostSyncs(TorchDispatchMode):
    """A dispatch mode that records each host read of a tensor value (see the module docstring).

    ``events`` lists ``(kind, place)`` pairs in order; :meth:`by_place` counts them per place.
    Use :func:`counting_syncs` (it also patches the methods that dispatch nothing on a CPU tensor).
    """

    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple[str, str]] = []
        self.paused = False

    def record(self, kind: str) -> None:
        if not self.paused:
            self.events.append((kind, _caller()))

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        if func is _SCALAR:
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
    try:
        with mode:
            yield mode
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)


__all__ = ["HostSyncs", "counting_syncs"]
