"""What a checkpoint from someone else may do when it is loaded: hand over tensors and plain data, and name
``tvq_exp`` classes to build; nothing else (docs/reliability.md, "Threat model").

* :func:`load_plain` reads a torch file with ``weights_only=True``: tensors, numbers, strings, lists, dicts,
  and the few non-torch types our own checkpoints hold (:data:`SAFE_GLOBALS`: the NumPy RNG state). A pickle
  that names any other global (``os.system``, a ``__reduce__`` payload) is refused before it runs.
* :func:`check_dcp_metadata` does the same for the ``.metadata`` file of a sharded checkpoint, which
  ``torch.distributed.checkpoint`` reads with plain ``pickle.load``.
* :func:`check_targets` checks a stored run config before anything is built from it: every ``_target_`` is
  a class defined inside ``tvq_exp`` or one of :data:`ALLOWED_FUNCTIONS`. The check reads the dotted path as
  text first, so no module outside ``tvq_exp`` is ever imported to answer it.

Each refusal is a :class:`UntrustedError` with a one-line message; the callers add the file's name.
"""

from __future__ import annotations

import importlib
import inspect
import io
import os
import pickle
import re
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch
from numpy._core.multiarray import _reconstruct  # how NumPy 2 pickles an array

PACKAGE = "tvq_exp"
# the functions (not classes) a stored config may name: the attention factory of conf/model/attention/*.yaml
ALLOWED_FUNCTIONS = frozenset({"tvq_exp.attention.build_attention"})
# the stored config's parts that loading a checkpoint builds (trainer, callbacks, loggers come from the command line)
BUILT_FROM_CHECKPOINT = ("model", "data", "module")
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
    """A file or a stored config that asks for more than plain data (code, a foreign class)."""


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


def targets(node: Any, key: str = "") -> Iterator[tuple[str, Any]]:
    """Every ``(key, _target_ value)`` below ``node`` (dicts and lists, depth first)."""
    if isinstance(node, Mapping):
        if "_target_" in node:
            yield (f"{key}._target_" if key else "_target_"), node["_target_"]
        for name, child in node.items():
            yield from targets(child, f"{key}.{name}" if key else str(name))
    elif isinstance(node, (list, tuple)):
        for i, child in enumerate(node):
            yield from targets(child, f"{key}[{i}]")


def allowed_target(path: Any) -> bool:
    """Whether ``path`` names a class defined inside ``tvq_exp`` or one of :data:`ALLOWED_FUNCTIONS`. Only a
    ``tvq_exp.`` path is ever imported to answer."""
    if not isinstance(path, str) or not path.startswith(PACKAGE + "."):
        return False
    if path in ALLOWED_FUNCTIONS:
        return True
    module_name, _, name = path.rpartition(".")
    try:
        found = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError):
        return False
    return inspect.isclass(found) and getattr(found, "__module__", "").startswith(PACKAGE + ".")


def check_targets(config: Mapping[str, Any]) -> None:
    """Refuse a stored run config whose ``model``, ``data`` or ``module`` names a ``_target_`` that
    :func:`allowed_target` refuses (:class:`UntrustedError` naming the key and the value)."""
    for part in BUILT_FROM_CHECKPOINT:
        for key, path in targets(config.get(part), part):
            if not allowed_target(path):
                raise UntrustedError(
                    f"its run config has {key}={path!r}: a stored config may only build classes of tvq_exp "
                    f"(or {', '.join(sorted(ALLOWED_FUNCTIONS))}); refused"
                )


__all__ = [
    "ALLOWED_FUNCTIONS",
    "SAFE_GLOBALS",
    "UntrustedError",
    "allowed_target",
    "check_dcp_metadata",
    "check_targets",
    "load_plain",
    "targets",
]
