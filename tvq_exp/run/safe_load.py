"""The one safe loader of torch files: what reading a file from someone else can do is hand over tensors and plain
data; nothing runs (docs/reliability.md, "Threat model"). Every reader of the project goes through it: ``train.py``
(``ckpt_path``, ``resume=auto``, ``init_from``, Lightning's own restore through
:class:`~tvq_exp.run.checkpoints.AtomicCheckpointIO` and the FSDP strategy), ``eval.py``, ``sample.py``, the FSDP
converter, the analysis tools and the scripts under ``tools/`` (:mod:`tvq_exp.run.checkpoints` wraps it).

* :func:`load_plain` reads a torch file with ``weights_only=True``: tensors, numbers, strings, lists, dicts,
  and the few non-torch types our own checkpoints hold (:data:`SAFE_GLOBALS`: the NumPy RNG state). A pickle
  that names any other global (``os.system``, a ``__reduce__`` payload) is refused before it runs.
* :func:`check_dcp_metadata` does the same for the ``.metadata`` file of a sharded checkpoint, which
  ``torch.distributed.checkpoint`` reads with plain ``pickle.load``; :func:`check_tensors_only` then refuses an
  index that names anything but tensors (torch unpickles a ``bytes`` item with ``weights_only=False``).

What a stored run config may say is :mod:`tvq_exp.run.stored`'s question. Each refusal here is an
:class:`UntrustedError` with a one-line message; the callers add the file's name.
"""

from __future__ import annotations

import importlib
import inspect
import io
import os
import pickle
import re
import warnings
from typing import Any

import numpy as np
import torch
from numpy._core.multiarray import _reconstruct  # how NumPy 2 pickles an array
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

# non-torch types in our own checkpoints: the NumPy RNG state (callbacks.rng_state) is a uint32 array
SAFE_GLOBALS: list[Any] = [np.ndarray, np.dtype, np.dtypes.UInt32DType, _reconstruct]
# the classes a torch.distributed.checkpoint ``.metadata`` pickle names (module -> names; "*": any class there)
DCP_GLOBALS: dict[str, set[str]] = {
    "torch.distributed.checkpoint.metadata": {"*"},
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.distributed.checkpoint.planner": {"*"},
    "torch.serialization": {"_get_layout"},
    "pathlib": {"PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"},
    "collections": {"OrderedDict"},
    "builtins": {"set", "frozenset", "slice"},
}
_GLOBAL = re.compile(r"GLOBAL ([\w.]+)")


class UntrustedError(ValueError):
    """A torch file that asks for more than tensors and plain data (code in its pickle, a bytes item)."""


def load_plain(source: str | os.PathLike[str] | io.BytesIO, map_location: Any = "cpu") -> Any:
    """``torch.load(source, weights_only=True)`` allowing :data:`SAFE_GLOBALS`; :class:`UntrustedError` when
    the pickle names anything else (other errors, e.g. a truncated file, pass through unchanged)."""
    try:
        with torch.serialization.safe_globals(SAFE_GLOBALS), warnings.catch_warnings():
            warnings.filterwarnings(
                "ignore", message="Detected pickle protocol"
            )  # refused below, in one line
            return torch.load(source, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as error:
        found = _GLOBAL.search(str(error))
        if found is None:  # not a global it refused: a damaged file (random bytes, an unknown opcode)
            raise
        raise UntrustedError(
            f"names {found.group(1)}, which a checkpoint of tvq_exp never holds; refused without running it "
            "(load only checkpoints from people you trust)"
        ) from None


class _DCPUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        allowed = DCP_GLOBALS.get(module, set())
        if name in allowed or ("*" in allowed and not name.startswith("__")):
            found = getattr(importlib.import_module(module), name)
            if name in allowed or inspect.isclass(found):
                return found
        if module == "torch" and isinstance(getattr(torch, name, None), (torch.dtype, torch.layout)):
            return getattr(torch, name)
        if module == "torch" and name == "Size":
            return torch.Size
        raise UntrustedError(
            f"names {module}.{name}, which a sharded checkpoint's .metadata never holds; refused without running it"
        )


def check_dcp_metadata(path: str | os.PathLike[str]) -> Any:
    """Unpickle a ``torch.distributed.checkpoint`` ``.metadata`` file allowing only :data:`DCP_GLOBALS`
    (:class:`UntrustedError` otherwise), before torch reads it with plain ``pickle.load``; the metadata."""
    with open(path, "rb") as file:
        return _DCPUnpickler(file).load()


def check_tensors_only(metadata: Any) -> None:
    """A ``torch.distributed.checkpoint`` index (:func:`check_dcp_metadata`'s result) that names tensors only:
    torch reads every other item (a ``BytesStorageMetadata``) with ``torch.load(weights_only=False)``, so one
    such item refuses the whole folder (:class:`UntrustedError` naming it), before any shard is read. Our own
    sharded checkpoints hold their optimiser's plain values in ``meta.pt`` (:mod:`tvq_exp.run.fsdp`)."""
    items = getattr(metadata, "state_dict_metadata", None)
    if not isinstance(items, dict) or not items:
        raise UntrustedError("indexes no tensors (not a torch.distributed.checkpoint index)")
    for name, item in items.items():
        if not isinstance(item, TensorStorageMetadata):
            raise UntrustedError(
                f"names {name!r} as a {type(item).__name__} item, which torch would unpickle with "
                "weights_only=False; a sharded checkpoint of tvq_exp holds tensors only: refused without reading it"
            )


__all__ = ["SAFE_GLOBALS", "UntrustedError", "check_dcp_metadata", "check_tensors_only", "load_plain"]
