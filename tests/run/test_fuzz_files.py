"""Fuzzing the files a user hands over (docs/reliability.md, "Bad input"): generated damaged, foreign and hostile
checkpoints and corpora, each given in-process to the loader every command uses (``read_checkpoint``: resume,
``eval.py``, ``sample.py``; ``read_weights``: ``init_from``; the corpus loaders of ``data=text_files`` and the
single-file corpora). Each is refused with one line naming the file; no payload runs.

The cases are generated from a seeded RNG and a real checkpoint (tests/fixtures/legacy): truncations at random
points, random bytes, foreign torch objects, pickles naming a dangerous global at several depths, ``_target_``-s
planted at several keys, binary and compressed text, truncated ``.gz``.
"""

from __future__ import annotations

import builtins
import copy
import gzip
import hashlib
import os
import random
import shutil
import subprocess
import webbrowser
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers.paths import REPO
from tvq_exp.data import CorruptFileError, DataNotFoundError
from tvq_exp.data.text.files import concat_files
from tvq_exp.data.text.gutenberg import GutenbergCorpus
from tvq_exp.data.text.local import SingleFileCorpus, TextFilesCorpus
from tvq_exp.run.checkpoints import CheckpointError, read_checkpoint, read_weights

SOURCE = REPO / "tests" / "fixtures" / "legacy" / "gau_vq_before_layout.ckpt"
RNG = random.Random(26)
VICTIM = "victim"  # a folder each payload would delete, or a file it would create, if it ran


class Call:
    """Unpickling this calls ``function(*args)``: a real ``__reduce__`` payload."""

    def __init__(self, function: Callable[..., Any], *args: Any) -> None:
        self.function, self.args = function, args

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        return self.function, self.args


def _payloads(folder: Path) -> list[Any]:
    victim = str(folder / VICTIM)
    return [
        Call(os.system, f"rm -rf {victim}"),
        Call(shutil.rmtree, victim),
        Call(builtins.eval, f"__import__('shutil').rmtree({victim!r})"),
        Call(builtins.exec, f"import shutil; shutil.rmtree({victim!r})"),
        Call(subprocess.call, ["rm", "-rf", victim]),
        Call(os.rmdir, victim),
        Call(webbrowser.open, "http://127.0.0.1:9/"),
        Call(builtins.open, victim + "/created", "w"),
        Call(os.remove, victim + "/x"),
        Call(__import__, "os"),
    ]


PLANTED_KEYS = [
    ("model",),
    ("model", "block"),
    ("model", "attention"),
    ("data",),
    ("data", "corpus"),
    ("module",),
]
PLANTED_TARGETS = [
    "os.system", "pathlib.Path.touch", "shutil.rmtree", "builtins.exec", "subprocess.run",
    "tvq_exp.run.checkpoints.remove_checkpoint", "tvq_exp_evil.Decoder", "tvq_exp.run.checkpoints.os.system",
]  # fmt: skip


def _checkpoint_cases(folder: Path, good: dict[str, Any]) -> list[tuple[str, Path, str]]:
    """(case name, file, the words its refusal must hold)."""
    cases: list[tuple[str, Path, str]] = []
    raw = SOURCE.read_bytes()
    for i, cut in enumerate(sorted(RNG.sample(range(len(raw)), 24)) + [0]):
        path = folder / f"truncated-{i}.ckpt"
        path.write_bytes(raw[:cut])
        cases.append((f"truncated at {cut}", path, "truncated or corrupt"))
    for i in range(15):
        path = folder / f"random-{i}.ckpt"
        path.write_bytes(RNG.randbytes(RNG.choice([1, 7, 100, 4096, 50_000])))
        cases.append(("random bytes", path, "truncated or corrupt"))
    foreign: list[Any] = [
        torch.ones(3), [1, 2], "text", 42, {}, {"weights": torch.ones(2)}, {"state_dict": {"w": torch.ones(1)}},
        {"state_dict": {}, "global_step": 1}, {"state_dict": {}, "global_step": 1, "hyper_parameters": {}},
        {"state_dict": {}, "global_step": 1, "hyper_parameters": {"run_config": "model: x"}},
        {"global_step": 3, "hyper_parameters": good["hyper_parameters"]}, {"epoch": 1, "global_step": 2},
        (torch.zeros(1),), {"state_dict": torch.ones(1), "global_step": 0}, None,
    ]  # fmt: skip
    for i, obj in enumerate(foreign):
        path = folder / f"foreign-{i}.ckpt"
        torch.save(obj, path)
        cases.append((f"foreign {type(obj).__name__}", path, "not a tvq_exp training checkpoint"))
    for i, payload in enumerate(_payloads(folder)):
        where = ["top", "state_dict", "hyper_parameters"][i % 3]
        checkpoint = copy.copy(good)
        if where == "top":
            checkpoint["extra"] = payload
        else:
            checkpoint[where] = {**good[where], "extra": payload}
        path = folder / f"payload-{i}.ckpt"
        protocol = 4 if i % 5 == 4 else 2  # torch's weights-only reader refuses protocol 4's framing outright
        torch.save(checkpoint, path, pickle_protocol=protocol)
        words = "refused without running it" if protocol == 2 else "truncated or corrupt"
        cases.append((f"payload {payload.function.__name__} in {where}", path, words))
    for i, (keys, target) in enumerate((k, t) for k in PLANTED_KEYS for t in PLANTED_TARGETS):
        if i % 3:
            continue  # a spread of 16 of the 48 combinations
        checkpoint = copy.deepcopy(good)
        node = checkpoint["hyper_parameters"]["run_config"]
        for key in keys:
            node = node[key]
        node["_target_"] = target
        path = folder / f"planted-{i}.ckpt"
        torch.save(checkpoint, path)
        cases.append((f"planted {target} at {'.'.join(keys)}", path, "a stored config may only pick"))
    return cases


def _corpus_cases(folder: Path) -> list[tuple[str, Callable[[], Any], Path, str]]:
    cases: list[tuple[str, Callable[[], Any], Path, str]] = []
    text = b"It was the best of times, it was the worst of times. " * 400
    packed = gzip.compress(text)
    for i in range(10):
        path = folder / f"binary-{i}.txt"
        path.write_bytes(RNG.randbytes(RNG.choice([64, 1000, 70_000])))
        loader = (lambda p=path: TextFilesCorpus(path=p.name, split_by="bytes").load(folder)) if i % 2 else (
            lambda p=path: SingleFileCorpus(path=p.name, name="c").load(folder))  # fmt: skip
        cases.append(("binary text", loader, path, "is not text"))
    for i in range(5):
        path = folder / f"packed-{i}.txt"
        path.write_bytes(packed)
        cases.append(
            ("gzip named .txt", lambda p=path: TextFilesCorpus(path=p.name).load(folder), path, "is not text")
        )
    for i, cut in enumerate(sorted(RNG.sample(range(20, len(packed) - 10), 10))):
        path = folder / f"cut-{i}.gz"
        path.write_bytes(packed[:cut])
        cases.append(("truncated .gz", lambda p=path: SingleFileCorpus(path=p.name, name="c").load(folder), path,
                      "truncated or corrupt"))  # fmt: skip
    missing = folder / "absent.txt"
    cases.append(
        ("missing", lambda: SingleFileCorpus(path=missing.name, name="c").load(folder), missing, "not found")
    )
    return cases


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz-files")


def test_generated_bad_checkpoints_are_refused_naming_the_file(folder: Path) -> None:
    good = torch.load(SOURCE, weights_only=False)
    (folder / VICTIM).mkdir()
    cases = _checkpoint_cases(folder, good)
    assert len(cases) >= 80
    for name, path, words in cases:
        for load in (read_checkpoint, read_weights):
            try:
                loaded = load(path)
            except CheckpointError as error:
                message = str(error)
                assert str(path) in message and "\n" not in message, (name, message)
                if load is read_checkpoint or words in ("truncated or corrupt", "refused without running it"):
                    assert words in message, (name, message)
            else:  # init_from takes a bare state dict of tensors; whether it fits the model is its check
                assert load is read_weights and name.startswith("foreign"), name
                assert all(torch.is_tensor(v) for v in loaded.get("state_dict", loaded).values()), name
    assert (folder / VICTIM).is_dir() and not any((folder / VICTIM).iterdir()), "a payload ran"


def test_generated_bad_corpora_are_refused_naming_the_file(folder: Path) -> None:
    cases = _corpus_cases(folder)
    assert len(cases) >= 25
    for name, load, path, words in cases:
        with pytest.raises((CorruptFileError, DataNotFoundError)) as error:
            load()
        message = " ".join(str(error.value).split())
        assert str(path) in message and words in message, (name, message)


BOOK = b"It was a bright cold day in April, and the clocks were striking thirteen. " * 1200  # 88 KB, > 64 KiB


def _library(folder: Path) -> tuple[Path, list[str]]:
    """A Gutenberg folder of four books and its catalogue rows (without the header)."""
    books = folder / "text" / "gutenberg"
    books.mkdir(parents=True)
    rows = []
    for i, split in enumerate(["train", "train", "validation", "test"]):
        (books / f"b{i}.txt").write_bytes(BOOK)
        rows.append(f"b{i}.txt\t{split}\t{len(BOOK)}\t{hashlib.sha256(BOOK).hexdigest()}\n")
    _catalogue(books, rows)
    return books, rows


def _catalogue(books: Path, rows: list[str]) -> None:
    (books / "CATALOG.tsv").write_text("file\tsplit\tbytes\tsha256\n" + "".join(rows))


def _library_cases(base: Path) -> list[tuple[str, Path, str]]:
    """(case, data root of a damaged library, the words its refusal must hold)."""
    cases: list[tuple[str, Path, str]] = []

    def library(name: str) -> tuple[Path, Path, list[str]]:
        root = base / name
        books, rows = _library(root)
        return root, books, rows

    for i in range(10):  # same-size edits with the modification time put back
        root, books, _ = library(f"edit-{i}")
        GutenbergCorpus().split_files(root)  # read once before the edit (a digest cache would remember it)
        book = books / f"b{RNG.randrange(4)}.txt"
        stat, data = book.stat(), bytearray(book.read_bytes())
        offset = RNG.randrange(len(data))
        data[offset] = ord("#") if data[offset] != ord("#") else ord("%")
        book.write_bytes(bytes(data))
        os.utime(book, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        cases.append((f"same-size edit at {offset}", root, "differs from CATALOG.tsv's"))
    for i in range(5):  # a row repeated somewhere
        root, books, rows = library(f"repeat-{i}")
        rows.insert(RNG.randrange(len(rows) + 1), rows[RNG.randrange(len(rows))])
        _catalogue(books, rows)
        cases.append(("repeated row", root, "is listed again"))
    for i, name in enumerate(["../outside.txt", "/etc/hostname", "x/../../outside.txt", "../../../etc/passwd",
                              "link.txt", "..\\outside.txt"]):  # fmt: skip
        root, books, rows = library(f"outside-{i}")
        (books.parent / "outside.txt").write_bytes(BOOK)
        (books / "link.txt").symlink_to(books.parent / "outside.txt")
        rows[0] = rows[0].replace("b0.txt", name, 1)
        _catalogue(books, rows)
        cases.append((f"row {name!r}", root, "is not a relative path inside"))
    for i in range(13):  # bytes that are not UTF-8 text, after the first 64 KiB (or anywhere)
        root, books, rows = library(f"binary-{i}")
        data = bytearray(BOOK)
        offset = RNG.randrange(1 << 16, len(data) - 4) if i < 10 else RNG.randrange(len(data) - 4)
        bad = [b"\xff\xfe", b"\xc3", b"\x80\x80", b"\x00", b"\xed\xa0\x80"][i % 5]
        data[offset : offset + len(bad)] = bad
        (books / "b2.txt").write_bytes(bytes(data))
        rows[2] = f"b2.txt\tvalidation\t{len(data)}\n"  # a catalogue without digests: the text check alone
        _catalogue(books, rows)
        cases.append((f"{bad!r} at {offset}", root, "NUL byte" if bad == b"\x00" else "is not valid UTF-8"))
    for i in range(5):  # a catalogue with bytes that are not UTF-8
        root, books, rows = library(f"catalogue-{i}")
        text = bytearray((books / "CATALOG.tsv").read_bytes())
        offset = RNG.randrange(len(text))
        text[offset : offset + 1] = b"\xff"
        (books / "CATALOG.tsv").write_bytes(bytes(text))
        cases.append((f"catalogue byte {offset}", root, "is not valid UTF-8"))
    return cases


def test_generated_bad_libraries_are_refused_naming_the_file(folder: Path) -> None:
    """Gutenberg libraries that lie: edits that keep size and mtime, repeated rows, rows outside the folder, bytes
    that are not UTF-8 text past the first 64 KiB, a catalogue that is not UTF-8. Each refused in one line."""
    cases = _library_cases(folder / "libraries")
    assert len(cases) >= 35
    for name, root, words in cases:
        with pytest.raises(CorruptFileError) as error:
            GutenbergCorpus().split_files(root)
        message = str(error.value)
        assert words in message and "\n" not in message and str(root) in message, (name, message)


def test_a_same_size_edit_gets_a_new_concatenation(folder: Path) -> None:
    """The concatenation cache is named by the books' content digests: an edit that keeps the size and the
    modification time is read, never the stale concatenation."""
    books = [folder / "cat-a.txt", folder / "cat-b.txt"]
    for book in books:
        book.write_bytes(BOOK)
    cache = folder / "cat-cache" / "train"
    for _ in range(5):
        book = RNG.choice(books)
        stat, data = book.stat(), bytearray(book.read_bytes())
        data[RNG.randrange(len(data))] = RNG.randrange(97, 123)
        book.write_bytes(bytes(data))
        os.utime(book, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        expected = books[0].read_bytes() + b"|" + books[1].read_bytes()
        assert concat_files(books, b"|", cache=cache).tobytes() == expected
