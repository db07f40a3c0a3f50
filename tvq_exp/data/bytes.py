"""Byte corpora: each corpus turns files under the data root into ``train``/``validation``/``test`` arrays.

Every split is a 1-D ``np.uint8`` array: a read-only ``np.memmap`` for a raw single file, or one buffer
(``np.frombuffer`` / ``np.empty`` filled by ``readinto``) for compressed files and concatenated folders.
Relative ``path`` values resolve against the data root (``$TVQ_DATA_DIR``, else ``./data``).
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import json
import math
import os
import shutil
import zipfile
import zlib
from abc import ABC, abstractmethod
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path
from urllib.parse import urlparse

import numpy as np

from tvq_exp.data.download import check_digest, digest_bytes, download
from tvq_exp.data.paths import CorruptFileError, DataNotFoundError, first_file, not_found, resolve

SPLITS = ("train", "validation", "test")
ZIP_MAGIC = b"PK\x03\x04"
GZIP_MAGIC = b"\x1f\x8b"
ENWIK_HELD_OUT = 5_000_000
ENWIK_FULL_SIZE = 100_000_000

Splits = dict[str, np.ndarray]


# ----------------------------------------------------------------------------------------------- reading


def read_bytes(path: Path) -> np.ndarray:
    """Bytes of a raw, ``.zip`` (single member) or ``.gz`` file as a 1-D ``np.uint8`` array.

    The format is detected from the magic number, so ``*.part`` files work too. Raw files are memory-mapped.
    A truncated or corrupt archive raises :class:`CorruptFileError` naming the file.
    """
    with open(path, "rb") as handle:
        magic = handle.read(4)
    try:
        if magic == ZIP_MAGIC:
            return np.frombuffer(_read_zip_member(path), dtype=np.uint8)
        if magic[:2] == GZIP_MAGIC:
            with gzip.open(path, "rb") as handle:
                return np.frombuffer(handle.read(), dtype=np.uint8)
    except (zipfile.BadZipFile, EOFError, zlib.error, gzip.BadGzipFile) as error:
        raise CorruptFileError(
            f"{path} is truncated or corrupt ({type(error).__name__}: {error}); delete it and fetch it again"
        ) from error
    if path.stat().st_size == 0:
        return np.zeros(0, dtype=np.uint8)
    return np.memmap(path, dtype=np.uint8, mode="r")


def _read_zip_member(path: Path) -> bytes:
    """The single file inside a zip archive (CRC-checked by :mod:`zipfile`)."""
    with zipfile.ZipFile(path) as archive:
        members = [info for info in archive.infolist() if not info.is_dir()]
        if len(members) != 1:
            names = [info.filename for info in members]
            raise CorruptFileError(f"{path} should hold exactly one file, found {names}")
        return archive.read(members[0])


def concat_files(files: Sequence[Path], separator: bytes, cache: Path | None = None) -> np.ndarray:
    """Concatenate ``files`` with ``separator`` between them into one ``np.uint8`` array.

    With ``cache`` (a path inside the data root), the concatenation is written once to a file whose name
    carries a fingerprint of the inputs (names and sizes) and memory-mapped afterwards; when that location
    is not writable it falls back to memory.
    """
    sizes = [path.stat().st_size for path in files]
    total = sum(sizes) + len(separator) * max(len(files) - 1, 0)
    if cache is not None:
        cached = _cached_concat(files, sizes, total, separator, cache)
        if cached is not None:
            return cached
    out = np.empty(total, dtype=np.uint8)
    view = memoryview(out)
    position = 0
    for index, (path, size) in enumerate(zip(files, sizes, strict=True)):
        if index:
            view[position : position + len(separator)] = separator
            position += len(separator)
        with open(path, "rb") as handle:
            if handle.readinto(view[position : position + size]) != size:
                raise CorruptFileError(f"{path} changed size while being read")
        position += size
    return out


def _cached_concat(
    files: Sequence[Path], sizes: Sequence[int], total: int, separator: bytes, cache: Path
) -> np.ndarray | None:
    """Memory-map (building it first if needed) the fingerprinted concatenation; ``None`` if unwritable."""
    fingerprint = hashlib.sha256(
        json.dumps(
            [[path.name, size] for path, size in zip(files, sizes, strict=True)] + [separator.hex()]
        ).encode()
    ).hexdigest()[:16]
    target = cache.with_name(f"{cache.name}-{fingerprint}.bin")
    if not (target.is_file() and target.stat().st_size == total):
        try:
            _write_concat(files, separator, target)
        except OSError:
            return None
    return np.memmap(target, dtype=np.uint8, mode="r") if total else np.zeros(0, dtype=np.uint8)


def _write_concat(files: Sequence[Path], separator: bytes, target: Path) -> None:
    """Stream the concatenation to ``target`` atomically."""
    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.with_name(target.name + ".part")
    try:
        with open(part, "wb") as out:
            for index, path in enumerate(files):
                if index:
                    out.write(separator)
                with open(path, "rb") as handle:
                    shutil.copyfileobj(handle, out, 1 << 20)
        os.replace(part, target)
    finally:
        part.unlink(missing_ok=True)


def text_files(folder: Path, suffixes: Sequence[str]) -> list[Path]:
    """Regular, non-hidden files under ``folder`` (recursive) with one of ``suffixes``, sorted by relative path."""
    found = [
        path
        for path in folder.rglob("*")
        if path.is_file()
        and path.suffix in suffixes
        and not any(part.startswith(".") for part in path.relative_to(folder).parts)
    ]
    return sorted(found, key=lambda path: path.relative_to(folder).as_posix())


# ----------------------------------------------------------------------------------------------- splitting


def split_fractions(data: np.ndarray, val_fraction: float, test_fraction: float) -> Splits:
    """Contiguous split: train first, then validation, then test, sized by fraction of ``len(data)``.

    Train gets ``floor(n * (1 - val - test))`` bytes (exact rational arithmetic, so 90% of 1,115,394 is
    1,003,854), test ``floor(n * test)``, validation the rest. With ``test_fraction == 0`` the test split *is*
    the validation split (same bytes).
    """
    n = len(data)
    val, test = Fraction(str(val_fraction)), Fraction(str(test_fraction))
    train_end = math.floor(n * (1 - val - test))
    test_start = n - math.floor(n * test)
    validation = data[train_end:test_start]
    return {
        "train": data[:train_end],
        "validation": validation,
        "test": data[test_start:] if test else validation,
    }


def split_held_out(data: np.ndarray) -> Splits:
    """The enwik8/text8 split: for >= 100M bytes the last 10M bytes are 5M validation + 5M test
    (90M/5M/5M for the real file); smaller files get 90%/5%/5%."""
    n = len(data)
    held = ENWIK_HELD_OUT if n >= ENWIK_FULL_SIZE else n // 20
    return {
        "train": data[: n - 2 * held],
        "validation": data[n - 2 * held : n - held],
        "test": data[n - held :],
    }


# ----------------------------------------------------------------------------------------------- corpora


class ByteCorpus(ABC):
    """A byte corpus: ``prepare(root)`` fetches files (rank 0 only), ``load(root)`` returns the splits.

    ``load`` returns ``{"train", "validation", "test"}`` -> 1-D ``np.uint8`` arrays of shape ``(n_split,)``.
    """

    name: str = "corpus"

    def prepare(self, root: Path) -> None:  # noqa: B027 (optional hook, not abstract)
        """Fetch missing files; the default has nothing to fetch."""

    @abstractmethod
    def load(self, root: Path) -> Splits:
        """Read the three splits."""


class MahoneyCorpus(ByteCorpus):
    """enwik8 / text8 style corpus: one 100M-byte file, raw or ``.zip``/``.gz``.

    Looked for as ``<root>/<name>{,.zip,.gz}`` and ``<root>/<name>/<name>{,.zip,.gz}``; when absent and
    ``download`` is on, ``url`` is fetched into ``<root>/<name>/``. ``md5`` is the digest of the *decompressed*
    corpus, checked on download and on every load (``None`` skips it).
    """

    def __init__(self, name: str, url: str, md5: str | None = None, download: bool = True) -> None:
        self.name = name
        self.url = url
        self.md5 = md5
        self.download = download

    def candidates(self, root: Path) -> list[Path]:
        """Every path the corpus file may have, in search order."""
        names = [self.name, f"{self.name}.zip", f"{self.name}.gz"]
        return [root / name for name in names] + [root / self.name / name for name in names]

    def download_target(self, root: Path) -> Path:
        """Where a download is written: the URL's file name when it is a known form, else ``<name>.zip``."""
        url_name = Path(urlparse(self.url).path).name
        known = {self.name, f"{self.name}.zip", f"{self.name}.gz"}
        return root / self.name / (url_name if url_name in known else f"{self.name}.zip")

    def prepare(self, root: Path) -> None:
        if first_file(self.candidates(root)) is not None:
            return
        if not self.download:
            raise self._missing(root)
        target = self.download_target(root)
        download(self.url, target, validate=lambda part: self._check(read_bytes(part), target))

    def load(self, root: Path) -> Splits:
        path = first_file(self.candidates(root))
        if path is None:
            raise self._missing(root)
        data = read_bytes(path)
        self._check(data, path)
        return split_held_out(data)

    def _check(self, data: np.ndarray, path: Path) -> None:
        """Compare the decompressed bytes with ``md5``."""
        if self.md5:
            check_digest(f"{path} (decompressed {self.name})", digest_bytes(memoryview(data)), self.md5)

    def _missing(self, root: Path) -> DataNotFoundError:
        return not_found(
            self.name,
            self.candidates(root),
            f"download {self.url} and put it at {self.download_target(root)}, or set download: true "
            "and let prepare_data() fetch it",
            root,
        )


class GutenbergCorpus(ByteCorpus):
    """The shared Gutenberg folder: splits from ``CATALOG.tsv``'s ``split`` column.

    Each split is its books concatenated in sorted file-name order with ``separator`` between them. Every
    book's size is checked against the catalogue's ``bytes`` column.
    """

    name = "gutenberg"

    def __init__(
        self, path: str = "text/gutenberg", separator: str = "\n\n", catalog: str = "CATALOG.tsv"
    ) -> None:
        self.path = path
        self.separator = separator.encode()
        self.catalog = catalog

    def split_files(self, root: Path) -> dict[str, list[Path]]:
        """Split name -> sorted book paths, as listed by the catalogue (sizes verified)."""
        folder = resolve(self.path, root)
        catalog = folder / self.catalog
        if not catalog.is_file():
            raise not_found(
                "Gutenberg catalogue",
                [catalog],
                f"put the gutenberg folder (with {self.catalog}) there",
                root,
            )
        files: dict[str, list[Path]] = {split: [] for split in SPLITS}
        with open(catalog, newline="", encoding="utf-8") as handle:
            for row in csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE):
                if row["split"] not in files:
                    raise CorruptFileError(f"{catalog}: unknown split {row['split']!r} for {row['file']}")
                files[row["split"]].append(self._checked_book(folder / row["file"], int(row["bytes"]), root))
        return {split: sorted(paths, key=lambda path: path.name) for split, paths in files.items()}

    @staticmethod
    def _checked_book(path: Path, expected_size: int, root: Path) -> Path:
        """``path`` after checking it exists and has the catalogued size."""
        if not path.is_file():
            raise not_found(
                f"Gutenberg book {path.name}", [path], "restore the file listed in CATALOG.tsv", root
            )
        if path.stat().st_size != expected_size:
            raise CorruptFileError(
                f"{path} has {path.stat().st_size} bytes, CATALOG.tsv says {expected_size}"
            )
        return path

    def load(self, root: Path) -> Splits:
        return {split: concat_files(paths, self.separator) for split, paths in self.split_files(root).items()}


class TextFilesCorpus(ByteCorpus):
    """Any text file or folder of text files (recursive, files ending in one of ``suffixes``).

    ``split_by="file"``: sorted files, index ``i % 20 == 0`` -> validation, ``i % 20 == 1`` -> test, the rest
    train; each split concatenated with ``separator``. ``split_by="bytes"``: 90%/5%/5% of the concatenation.
    """

    name = "text_files"

    def __init__(
        self,
        path: str,
        split_by: str = "file",
        separator: str = "\n\n",
        suffixes: Sequence[str] = (".txt",),
    ) -> None:
        if split_by not in ("file", "bytes"):
            raise ValueError(f"split_by must be 'file' or 'bytes', got {split_by!r}")
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
        if self.split_by == "bytes":
            return split_fractions(concat_files(files, self.separator), 0.05, 0.05)
        if len(files) < 3:
            raise ValueError(
                f"split_by=file needs at least 3 files, found {len(files)} under {resolve(self.path, root)}; "
                "use split_by=bytes"
            )
        groups: dict[str, list[Path]] = {"validation": files[0::20], "test": files[1::20]}
        groups["train"] = [path for index, path in enumerate(files) if index % 20 > 1]
        return {split: concat_files(groups[split], self.separator) for split in SPLITS}


class SingleFileCorpus(ByteCorpus):
    """One text file split by fractions (train first). ``test_fraction=0`` reuses validation as test."""

    def __init__(self, path: str, name: str, val_fraction: float = 0.1, test_fraction: float = 0.0) -> None:
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

    def __init__(
        self, path: str = "text/kjv_bible.txt", test_marker: str = "Jude 1", val_fraction: float = 0.05
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


class PG19Corpus(ByteCorpus):
    """PG-19 in its official layout ``<path>/{train,validation,test}/*.txt``.

    Each split is its books in sorted file-name order joined by ``separator``; the concatenation is cached
    as ``<path>/<split>-<fingerprint>.bin`` (memory-mapped) when the folder is writable. When the folders are
    missing and ``hub`` is on, ``prepare`` writes them from ``datasets.load_dataset(hub_name)`` (needs network).
    """

    name = "pg19"

    def __init__(
        self, path: str = "pg19", separator: str = "\n\n", hub: bool = True, hub_name: str = "deepmind/pg19"
    ) -> None:
        self.path = path
        self.separator = separator.encode()
        self.hub = hub
        self.hub_name = hub_name

    def split_dirs(self, root: Path) -> dict[str, Path]:
        """Split name -> folder of that split's books."""
        folder = resolve(self.path, root)
        return {split: folder / split for split in SPLITS}

    def missing_splits(self, root: Path) -> list[Path]:
        """Split folders that are absent or hold no ``*.txt``."""
        return [folder for folder in self.split_dirs(root).values() if not any(folder.glob("*.txt"))]

    def prepare(self, root: Path) -> None:
        missing = self.missing_splits(root)
        if not missing:
            return
        if not self.hub:
            raise self._missing(root, missing)
        try:
            self._fetch_from_hub(root)
        except Exception as error:
            raise self._missing(
                root, missing, f"the Hugging Face hub ({self.hub_name}) failed: {error}"
            ) from error

    def load(self, root: Path) -> Splits:
        missing = self.missing_splits(root)
        if missing:
            raise self._missing(root, missing)
        return {
            split: concat_files(sorted(folder.glob("*.txt")), self.separator, cache=folder.parent / split)
            for split, folder in self.split_dirs(root).items()
        }

    def _fetch_from_hub(self, root: Path) -> None:
        """Write every book of every split as ``<split>/<gutenberg id>.txt`` (atomically per split)."""
        import datasets
        import huggingface_hub.constants

        if huggingface_hub.constants.HF_HUB_OFFLINE:
            raise ConnectionError("HF_HUB_OFFLINE is set")
        folder = resolve(self.path, root)
        for split, target in self.split_dirs(root).items():
            if any(target.glob("*.txt")):
                continue
            books = datasets.load_dataset(self.hub_name, split=split, cache_dir=str(folder / ".hf_cache"))
            part = target.with_name(target.name + ".part")
            part.mkdir(parents=True, exist_ok=True)
            for book in books:
                book_id = str(book["url"]).rstrip("/").rsplit("/", 1)[-1]
                (part / f"{book_id}.txt").write_text(book["text"], encoding="utf-8")
            shutil.rmtree(target, ignore_errors=True)
            os.replace(part, target)

    def _missing(self, root: Path, missing: Sequence[Path], reason: str = "") -> DataNotFoundError:
        prefix = f"{reason}. " if reason else ""
        return not_found(
            "PG-19 book files (*.txt)",
            missing,
            f"{prefix}put the official PG-19 files in {resolve(self.path, root)}/{{train,validation,test}}/, "
            "or run prepare_data() once with network access and hub: true",
            root,
        )


def _read_file(path: str, name: str, root: Path) -> np.ndarray:
    """Memory-map one corpus file, raising :class:`DataNotFoundError` when it is missing."""
    target = resolve(path, root)
    if not target.is_file():
        raise not_found(name, [target], "put the file there or set data.corpus.path", root)
    return read_bytes(target)


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
