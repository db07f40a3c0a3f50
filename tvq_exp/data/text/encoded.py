"""Encoded split files of a text corpus (``data=hf``): ``<split>.bin`` (the text's UTF-8 bytes, written
atomically) and its manifest ``<split>.json``: bytes, documents, every document's start offset, SHA-256 and the
content digest :func:`tvq_exp.data.content.content_digest` checked when the file is opened."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from tvq_exp.console import say
from tvq_exp.data.content import ALGORITHM, content_digest


def encode_split(texts: Iterable[str], path: Path, separator: bytes, label: str) -> dict[str, Any]:
    """Write ``texts`` as UTF-8 joined by ``separator`` to ``path`` (atomically) and its manifest beside it. A
    progress bar on a terminal; one line when done either way (a bar in a log file says only "0 docs")."""
    from tqdm.auto import tqdm

    digest, offsets, size = hashlib.sha256(), [], 0
    partial = path.with_suffix(".bin.part")
    bar = tqdm(texts, desc=f"encoding {label}", unit=" docs", leave=False, disable=not sys.stderr.isatty())
    with open(partial, "wb") as out:
        for index, text in enumerate(bar):
            chunk = (separator if index else b"") + text.encode("utf-8")
            offsets.append(size + (len(separator) if index else 0))
            out.write(chunk)
            digest.update(chunk)
            size += len(chunk)
    os.replace(partial, path)
    say(f"data=hf: encoded {label}: {len(offsets):,} documents, {size:,} bytes -> {path}")
    return write_manifest(path, {"bytes": size, "documents": len(offsets), "sha256": digest.hexdigest(),
                                 "offsets": offsets})  # fmt: skip


def write_bytes(data: np.ndarray, path: Path) -> dict[str, Any]:
    """Write the bytes ``data`` (one piece of text) to ``path`` (atomically) and its manifest beside it."""
    partial = path.with_suffix(".bin.part")
    partial.write_bytes(data.tobytes())
    os.replace(partial, path)
    manifest = {"bytes": len(data), "documents": 1, "sha256": hashlib.sha256(data.tobytes()).hexdigest()}
    return write_manifest(path, manifest | {"offsets": [0]})


def write_manifest(path: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """``manifest`` with ``path``'s content digest, written to ``<path stem>.json``."""
    manifest = manifest | {ALGORITHM: content_digest(path)}
    path.with_suffix(".json").write_text(json.dumps(manifest))
    return manifest


def encoded(folder: Path, split: str) -> bool:
    """Whether ``split`` is encoded in ``folder`` with a content digest (an older manifest: encoded again)."""
    try:
        return ALGORITHM in json.loads((folder / f"{split}.json").read_text())
    except (OSError, ValueError):
        return False


__all__ = ["encode_split", "encoded", "write_bytes", "write_manifest"]
