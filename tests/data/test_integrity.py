"""Data integrity (docs/reliability.md, "Data integrity"): the Gutenberg catalogue's checksums (hashed once per
file, cached by size and mtime outside the data root), a truncated or edited catalogue, binary or compressed
files given as text, the PG-19 concatenation cache keyed by content, and the sha256 of a downloaded corpus."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest

from tvq_exp.data import ChecksumError, CorruptFileError
from tvq_exp.data.digests import CACHE_ENV, CACHE_FILE, file_sha256
from tvq_exp.data.text import MahoneyCorpus
from tvq_exp.data.text.files import concat_files
from tvq_exp.data.text.gutenberg import GutenbergCorpus
from tvq_exp.data.text.local import SingleFileCorpus, TextFilesCorpus

HEADER = "file\tsplit\tbytes\tsha256\ttitle\n"


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def _library(root: Path) -> Path:
    """A stand-in Gutenberg folder: four books (two train, one validation, one test) and their catalogue."""
    folder = root / "text" / "gutenberg"
    folder.mkdir(parents=True)
    rows = []
    for i, split in enumerate(["train", "train", "validation", "test"]):
        text = f"book {i}. It was a dark and stormy night.\n".encode() * (50 + i)
        (folder / f"b{i}.txt").write_bytes(text)
        rows.append(f"b{i}.txt\t{split}\t{len(text)}\t{hashlib.sha256(text).hexdigest()}\tBook {i}\n")
    (folder / "CATALOG.tsv").write_text(HEADER + "".join(rows))
    return folder


def _files(root: Path, **options: str) -> dict[str, list[str]]:
    splits = GutenbergCorpus(**options).split_files(root)
    return {split: [p.name for p in paths] for split, paths in splits.items()}


def test_a_same_size_edit_of_a_book_is_refused(tmp_path: Path) -> None:
    folder = _library(tmp_path)
    assert _files(tmp_path) == {"train": ["b0.txt", "b1.txt"], "validation": ["b2.txt"], "test": ["b3.txt"]}
    book = folder / "b1.txt"
    data = bytearray(book.read_bytes())
    data[10] = ord("X")  # same size
    book.write_bytes(bytes(data))
    with pytest.raises(CorruptFileError, match=r"b1\.txt: sha256 .* differs from CATALOG\.tsv's"):
        _files(tmp_path)


def test_an_edit_past_the_first_mebibyte_of_a_large_book_is_refused(tmp_path: Path, _cache: Path) -> None:
    """A 2.5 MiB book (the digest reads 1 MiB at a time: three reads) edited in its last half MiB, same size,
    with an empty digest cache: its whole content is hashed, so the edit is seen."""
    folder = _library(tmp_path)
    assert not (_cache / CACHE_FILE).exists()
    book = folder / "b0.txt"
    text = b"a large book. It was a dark and stormy night.\n" * (5 * 2**20 // 2 // 46 + 1)
    assert len(text) > 2.5 * 2**20
    book.write_bytes(text)
    catalog = folder / "CATALOG.tsv"
    rows = catalog.read_text().splitlines(keepends=True)
    rows[1] = f"b0.txt\ttrain\t{len(text)}\t{hashlib.sha256(text).hexdigest()}\tBook 0\n"
    catalog.write_text("".join(rows))
    assert file_sha256(book) == hashlib.sha256(text).hexdigest()
    assert _files(tmp_path)["train"] == ["b0.txt", "b1.txt"]
    edited = bytearray(text)
    edited[-1000] = ord("X")
    (_cache / CACHE_FILE).unlink()  # empty again: nothing remembered from the good file
    book.write_bytes(bytes(edited))
    with pytest.raises(CorruptFileError, match=r"b0\.txt: sha256 .* differs from CATALOG\.tsv's"):
        _files(tmp_path)


def test_the_digest_is_paid_once_per_file_and_cached_outside_the_data_root(
    tmp_path: Path, _cache: Path
) -> None:
    folder = _library(tmp_path)
    before = sorted(p.relative_to(tmp_path) for p in (tmp_path / "text").rglob("*"))
    _files(tmp_path)
    assert (
        sorted(p.relative_to(tmp_path) for p in (tmp_path / "text").rglob("*")) == before
    )  # nothing written there
    cache = json.loads((_cache / CACHE_FILE).read_text())
    book = folder / "b0.txt"
    size, mtime, digest = cache[str(book.resolve())]
    assert (size, mtime, digest) == (
        book.stat().st_size,
        book.stat().st_mtime_ns,
        hashlib.sha256(book.read_bytes()).hexdigest(),
    )
    # the cached digest is what the next run uses: a planted wrong one (same size and mtime) is believed ...
    cache[str(book.resolve())] = [size, mtime, "0" * 64]
    (_cache / CACHE_FILE).write_text(json.dumps(cache))
    with pytest.raises(CorruptFileError, match="b0.txt: sha256 0{64}"):
        _files(tmp_path)
    # ... until the file's mtime changes: then it is hashed again
    os.utime(book, ns=(mtime + 10**9, mtime + 10**9))
    assert _files(tmp_path)["train"] == ["b0.txt", "b1.txt"]


def test_a_truncated_or_edited_catalogue_is_refused(tmp_path: Path) -> None:
    folder = _library(tmp_path)
    catalog = folder / "CATALOG.tsv"
    text = catalog.read_text()
    digest = hashlib.sha256(text.encode()).hexdigest()
    assert _files(tmp_path, catalog_sha256=digest)["test"] == ["b3.txt"]
    lines = text.splitlines(keepends=True)
    catalog.write_text("".join(lines[:2] + lines[3:]))  # a deleted row, cut at a row boundary
    with pytest.raises(CorruptFileError, match=r"CATALOG\.tsv does not list b1\.txt .*truncated or edited"):
        _files(tmp_path)
    with pytest.raises(CorruptFileError, match=rf"CATALOG\.tsv: sha256 .* is not the catalogue's {digest}"):
        _files(tmp_path, catalog_sha256=digest)
    catalog.write_text(text[: len(text) // 2])  # cut inside a row
    with pytest.raises(CorruptFileError, match="incomplete row"):
        _files(tmp_path)


def test_binary_and_compressed_files_are_not_text(tmp_path: Path) -> None:
    noise = np.random.default_rng(0).integers(0, 256, 100_000, dtype=np.uint8).tobytes()
    (tmp_path / "noise.txt").write_bytes(noise)
    with pytest.raises(CorruptFileError, match=r"noise\.txt is not text \(a NUL byte at offset"):
        TextFilesCorpus(path="noise.txt", split_by="bytes").load(tmp_path)
    (tmp_path / "packed.txt").write_bytes(gzip.compress(b"plain words " * 10_000))  # a .gz without its name
    with pytest.raises(CorruptFileError, match=r"packed\.txt is not text"):
        TextFilesCorpus(path="packed.txt", split_by="bytes").load(tmp_path)
    controls = bytes([1, 2, 3, 4]) * 100 + b"words " * 1000  # no NUL, but 6% control bytes
    (tmp_path / "controls.txt").write_bytes(controls)
    with pytest.raises(CorruptFileError, match=r"controls\.txt is not text \(6% control bytes"):
        SingleFileCorpus(path="controls.txt", name="c").load(tmp_path)
    whole = gzip.compress(b"plain words " * 10_000)
    (tmp_path / "cut.gz").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(CorruptFileError, match=r"cut\.gz is truncated or corrupt"):
        SingleFileCorpus(path="cut.gz", name="c").load(tmp_path)
    (tmp_path / "fine.gz").write_bytes(whole)  # a whole .gz of text is text
    splits = SingleFileCorpus(path="fine.gz", name="c").load(tmp_path)
    assert splits["train"].tobytes() + splits["validation"].tobytes() == b"plain words " * 10_000


def test_the_concatenation_cache_is_keyed_by_content(tmp_path: Path) -> None:
    books = [tmp_path / "a.txt", tmp_path / "b.txt"]
    books[0].write_bytes(b"first book")
    books[1].write_bytes(b"other book")
    cache = tmp_path / "cache" / "train"
    assert concat_files(books, b"|", cache=cache).tobytes() == b"first book|other book"
    books[1].write_bytes(b"OTHER BOOK")  # same name, same size
    assert concat_files(books, b"|", cache=cache).tobytes() == b"first book|OTHER BOOK"
    assert len(list(cache.parent.glob("train-*.bin"))) == 2


def test_a_corpus_with_the_wrong_sha256_is_refused(tmp_path: Path) -> None:
    (tmp_path / "text8").write_bytes(b"anarchism originated as a term of abuse " * 100)
    expected = hashlib.sha256((tmp_path / "text8").read_bytes()).hexdigest()
    corpus = MahoneyCorpus("text8", "http://127.0.0.1:9/text8.zip", sha256=expected, download=False)
    assert len(corpus.load(tmp_path)["train"]) == 3600
    with pytest.raises(ChecksumError, match=f"sha256 mismatch .*expected {'f' * 64}, got {expected}"):
        MahoneyCorpus("text8", "http://127.0.0.1:9/text8.zip", sha256="f" * 64, download=False).load(tmp_path)
