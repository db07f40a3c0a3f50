"""Payloads that touch a marker file if they ever run: the proof, in the tests of docs/reliability.md's threat
model, that reading a file from someone else runs nothing."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any


class Payload:
    """Unpickling this runs ``touch <marker>`` (a real ``__reduce__`` payload)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[str]]:
        return os.system, (f"touch {self.marker}",)


def makedirs_node(marker: Path) -> dict[str, Any]:
    """A config node that creates the folder ``marker`` when Hydra builds it (``os.makedirs``, which Hydra's own
    blocklist lets through)."""
    return {"_target_": "os.makedirs", "name": str(marker)}


def makedirs_resolver(marker: Path) -> str:
    """A string that becomes :func:`makedirs_node` when OmegaConf resolves it (``oc.create``)."""
    return "${oc.create:{_target_: os.makedirs, name: " + str(marker) + "}}"
