"""Local text: any file or folder of text files, one file split by fractions, the King James Bible."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import numpy as np

from tvq_exp.console import say
from tvq_exp.data.paths import not_found, resolve
from tvq_exp.data.text.corpus import SPLITS, ByteCorpus, Splits
from tvq_exp.data.text.files import (
    check_text,
    check_text_files,
    concat_files,
    read_bytes,
    split_fractions,
    text_files,
)
from tvq_exp.options import Between, OneOf, checked


class TextFilesCorpus(ByteCorpus):
    """Any text file or folder of text files (recursive, files ending in one of ``suffixes``).

    ``split_by="file"``: sorted files, index ``i % 20 == 0`` -> validation, ``i % 20 == 1`` -> test, the rest
    train; each split concatenated with ``separator``. ``split_by="bytes"``: 90%/5%/5% of the concatenation,
    which is also how a single file or a folder of fewer than 3 files is split (one line says so).
    """

    name = "text_files"

    @checked
    def __init__(
        self,
        path: str,
        split_by: Annotated[str, OneOf("file", "bytes")] = "file",
        separator: str = "\n\n",
        suffixes: Sequence[str] = (".txt",),
    ) -> None:
        self.path = path
        self.split_by = split_by
        self.separator = separator.encode()
        self.suffixes = tuple(suffixes)

    def files(self, root: Path) -> list[Path]:
        """The corpus files in split order."""
        target = resolve(self.path, root)
        if target.is_file():
            return [target]
        found = text_files(target, self.suffixes) if target.is_dir() else []
        if not found:
            raise not_found(
                f"text files ({', '.join(self.suffixes)})",
                [target],
                "point data.corpus.path at a file or folder of text",
                root,
            )
        return found

    def load(self, root: Path) -> Splits:
        files = self.files(root)
        check_text_files(files)
        if self.split_by == "file" and len(files) < len(SPLITS):
            folder = resolve(self.path, root)
            what = (
                "is one file" if folder.is_file() else f"holds {len(files)} files, fewer than one per split"
            )
            say(f"data=text_files: {folder} {what}: split by bytes 90/5/5 (data.corpus.split_by=bytes)")
        if self.split_by == "bytes" or len(files) < len(SPLITS):
            return split_fractions(concat_files(files, self.separator), 0.05, 0.05)
        groups: dict[str, list[Path]] = {"validation": files[0::20], "test": files[1::20]}
        groups["train"] = [path for index, path in enumerate(files) if index % 20 > 1]
        return {split: concat_files(groups[split], self.separator) for split in SPLITS}


class SingleFileCorpus(ByteCorpus):
    """One text file split by fractions (train first). ``test_fraction=0`` reuses validation as test."""

    @checked
    def __init__(
        self,
        path: str,
        name: str,
        val_fraction: Annotated[float, Between(0, 1, "()")] = 0.1,
        test_fraction: Annotated[float, Between(0, 1, "[)")] = 0.0,
    ) -> None:
        self.path = path
        self.name = name
        self.val_fraction = val_fraction
        self.test_fraction = test_fraction

    def load(self, root: Path) -> Splits:
        return split_fractions(_read_file(self.path, self.name, root), self.val_fraction, self.test_fraction)


class KJVCorpus(ByteCorpus):
    """The King James Bible: test from the line ``test_marker`` (``Jude 1``) to the end; validation is the
    last ``val_fraction`` of the bytes before it; train is everything earlier."""

    name = "kjv"

    @checked
    def __init__(
        self,
        path: str = "text/kjv_bible.txt",
        test_marker: str = "Jude 1",
        val_fraction: Annotated[float, Between(0, 1, "()")] = 0.05,
    ) -> None:
        self.path = path
        self.test_marker = test_marker
        self.val_fraction = val_fraction

    def load(self, root: Path) -> Splits:
        data = _read_file(self.path, self.name, root)
        test_start = _line_offset(data, self.test_marker, resolve(self.path, root))
        val_start = test_start - int(test_start * self.val_fraction)
        return {
            "train": data[:val_start],
            "validation": data[val_start:test_start],
            "test": data[test_start:],
        }


def _read_file(path: str, name: str, root: Path) -> np.ndarray:
    """Memory-map one corpus file, raising :class:`DataNotFoundError` when it is missing."""
    target = resolve(path, root)
    if not target.is_file():
        raise not_found(name, [target], "put the file there or set data.corpus.path", root)
    data = read_bytes(target)
    check_text(data, target)
    return data


def _line_offset(data: np.ndarray, line: str, path: Path) -> int:
    """Byte offset of the first line equal to ``line``."""
    raw = data.tobytes()
    needle = line.encode()
    if raw.startswith(needle + b"\n"):
        return 0
    index = raw.find(b"\n" + needle + b"\n")
    if index < 0:
        raise ValueError(f"{path} has no line {line!r} to start the test split at")
    return index + 1
