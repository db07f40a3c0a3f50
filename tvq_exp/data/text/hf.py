"""Any text dataset of the Hugging Face ``datasets`` library, encoded once into memory-mapped byte files.

``path`` is a hub name (``"pg19"``, with ``config``), a folder written by ``save_to_disk``, or a data file or
folder of ``.parquet`` / ``.arrow`` / ``.json(l)`` / ``.csv`` files. Each split's documents (the ``text_field``
column) are written as UTF-8 with ``separator`` between them to ``<root>/<cache>/<key>/<split>.bin`` (a progress
bar per split), next to a manifest ``<split>.json``: SHA-256, bytes, documents and every document's start offset
(for resets at document boundaries). ``load`` memory-maps the files, so a corpus larger than RAM (PG-19, about
11 GB) is never read whole, and a second run reuses the encoded files. ``<key>`` is a fingerprint of the source
and the options, so a different dataset or field never reads a stale encoding.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from tvq_exp.data.paths import CorruptFileError, DataNotFoundError
from tvq_exp.data.text.corpus import SPLITS, ByteCorpus, Splits
from tvq_exp.options import checked

FILE_BUILDERS = {".parquet": "parquet", ".arrow": "arrow", ".json": "json", ".jsonl": "json", ".csv": "csv"}


class HFTextCorpus(ByteCorpus):
    """A ``datasets`` text corpus (module docstring). ``splits`` maps our ``train`` / ``validation`` / ``test``
    to the dataset's split names."""

    name = "hf"

    @checked
    def __init__(
        self,
        path: str,
        config: str | None = None,
        text_field: str = "text",
        splits: Mapping[str, str] | None = None,
        separator: str = "\n\n",
        cache: str = "hf_encoded",
    ) -> None:
        self.path, self.config, self.text_field = path, config, text_field
        self.splits = dict(splits or {split: split for split in SPLITS})
        missing = set(SPLITS) - set(self.splits)
        if missing:
            raise CorruptFileError(f"data.corpus.splits: no dataset split given for {sorted(missing)}")
        self.separator = separator.encode()
        self.cache = cache

    def folder(self, root: Path) -> Path:
        """Where this corpus's encoded splits live."""
        source = str(Path(self.path).resolve()) if Path(self.path).exists() else self.path
        options = [source, self.config, self.text_field, sorted(self.splits.items()), self.separator.hex()]
        key = hashlib.sha256(json.dumps(options, default=str).encode()).hexdigest()[:16]
        return root / self.cache / key

    def prepare(self, root: Path) -> None:
        folder = self.folder(root)
        todo = [split for split in SPLITS if not (folder / f"{split}.json").is_file()]
        if not todo:
            return
        dataset = self._dataset()
        folder.mkdir(parents=True, exist_ok=True)
        for split in todo:
            name = self.splits[split]
            if name not in dataset:
                raise DataNotFoundError(
                    f"{self.path} has no split {name!r} (it has {', '.join(dataset)}); set data.corpus.splits.{split}"
                )
            encode_split(
                self._texts(dataset[name]), folder / f"{split}.bin", self.separator, f"{split} ({name})"
            )

    def load(self, root: Path) -> Splits:
        folder = self.folder(root)
        splits = {}
        for split in SPLITS:
            if not (folder / f"{split}.json").is_file():
                raise DataNotFoundError(
                    f"{folder / split}.bin is not encoded yet: prepare() the corpus first"
                )
            manifest = json.loads((folder / f"{split}.json").read_text())
            path = folder / f"{split}.bin"
            if path.stat().st_size != manifest["bytes"]:
                raise CorruptFileError(
                    f"{path} has {path.stat().st_size} bytes, its manifest says {manifest['bytes']}"
                )
            splits[split] = (
                np.memmap(path, dtype=np.uint8, mode="r")
                if manifest["bytes"]
                else np.empty(0, dtype=np.uint8)
            )
        return splits

    def _dataset(self) -> Any:
        """The dataset's splits (a ``DatasetDict``)."""
        import datasets

        path = Path(self.path)
        try:
            if path.is_dir() and (path / "dataset_dict.json").is_file():
                return datasets.load_from_disk(str(path))
            if path.exists():
                files = (
                    [path]
                    if path.is_file()
                    else sorted(p for p in path.rglob("*") if p.suffix in FILE_BUILDERS)
                )
                if not files:
                    raise DataNotFoundError(
                        f"{path}: no {', '.join(FILE_BUILDERS)} files (or save_to_disk folder)"
                    )
                return datasets.load_dataset(
                    FILE_BUILDERS[files[0].suffix], data_files=[str(f) for f in files]
                )
            return datasets.load_dataset(self.path, self.config)
        except (FileNotFoundError, ConnectionError, ValueError) as error:
            raise DataNotFoundError(f"cannot load the dataset {self.path!r}: {error}") from error

    def _texts(self, split: Any) -> Iterable[str]:
        if self.text_field not in split.column_names:
            raise CorruptFileError(
                f"{self.path}: no column {self.text_field!r} (columns: {', '.join(split.column_names)}); "
                "set data.corpus.text_field"
            )
        return (row[self.text_field] for row in split)


def encode_split(texts: Iterable[str], path: Path, separator: bytes, label: str) -> dict[str, Any]:
    """Write ``texts`` as UTF-8 joined by ``separator`` to ``path`` (atomically) and its manifest beside it."""
    from tqdm.auto import tqdm

    digest, offsets, size = hashlib.sha256(), [], 0
    partial = path.with_suffix(".bin.part")
    with open(partial, "wb") as out:
        for index, text in enumerate(tqdm(texts, desc=f"encoding {label}", unit=" docs", leave=False)):
            chunk = (separator if index else b"") + text.encode("utf-8")
            offsets.append(size + (len(separator) if index else 0))
            out.write(chunk)
            digest.update(chunk)
            size += len(chunk)
    os.replace(partial, path)
    manifest = {"bytes": size, "documents": len(offsets), "sha256": digest.hexdigest(), "offsets": offsets}
    path.with_suffix(".json").write_text(json.dumps(manifest))
    return manifest


__all__ = ["HFTextCorpus", "encode_split"]
