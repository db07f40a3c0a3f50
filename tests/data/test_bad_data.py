"""Each kind of bad data, run through the real ``train.py``: exit status 2 and one ``error:`` line on
stderr that names the file and says how to fix it (no traceback)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.paths import REPO

QUICK = [
    "trainer=cpu",
    "model=tiny",
    "trainer.max_steps=1",
    "trainer.enable_progress_bar=false",
    "logger=none",
]
TEXT = ["data=text_files", "data.seq_len=64", "data.batch_size=2", "data.eval_batch_size=2"]


def missing_file(root: Path) -> tuple[list[str], str, str]:
    return (
        [*TEXT, "data.corpus.path=no_such_folder"],
        str(root / "no_such_folder"),
        "Fix: point data.corpus.path",
    )


def wrong_checksum(root: Path) -> tuple[list[str], str, str]:
    (root / "enwik8").write_bytes(b"not the real enwik8\n" * 100)
    return ["data=enwik8", "data.seq_len=64"], str(root / "enwik8"), "delete it and fetch it again"


def truncated_archive(root: Path) -> tuple[list[str], str, str]:
    import zipfile

    with zipfile.ZipFile(root / "enwik8.zip", "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("enwik8", bytes(range(256)) * 400)
    data = (root / "enwik8.zip").read_bytes()
    (root / "enwik8.zip").write_bytes(data[: len(data) // 2])
    return ["data=enwik8", "data.seq_len=64"], str(root / "enwik8.zip"), "truncated or corrupt"


def wrong_image_shape(root: Path) -> tuple[list[str], str, str]:
    folder = root / "imagenet64"
    folder.mkdir()
    pixels = np.zeros((4, 64 * 64 * 3), dtype=np.uint8)
    np.savez(folder / "Imagenet64_train_part1.npz", data=pixels[:, :3072])
    np.savez(folder / "Imagenet64_train_part2.npz", data=pixels)
    np.savez(folder / "Imagenet64_val.npz", data=pixels)
    path = folder / "Imagenet64_train_part1.npz"
    return ["data=imagenet64", "data.source.val_size=2"], str(path), "replace it with the right file"


def corpus_too_small(root: Path) -> tuple[list[str], str, str]:
    (root / "tiny.txt").write_bytes(b"x" * 1000)
    overrides = [*TEXT, "data.corpus.path=tiny.txt", "data.corpus.split_by=bytes"]
    return overrides, str(root / "tiny.txt"), "lower data.seq_len"


def truncated_catalog(root: Path) -> tuple[list[str], str, str]:
    folder = root / "text" / "gutenberg"
    folder.mkdir(parents=True)
    rows = ["file\tsplit\tbytes"]
    for i, split in enumerate(("train", "validation", "test")):
        (folder / f"b{i}.txt").write_bytes(b"a book. " * 200)
        rows.append(f"b{i}.txt\t{split}\t1600")
    text = "\n".join(rows) + "\n"
    (folder / "CATALOG.tsv").write_text(text[: text.rindex("\t")])  # cut inside the last row
    return ["data=gutenberg", "data.seq_len=64"], str(folder / "CATALOG.tsv"), "restore it"


def empty_file(root: Path) -> tuple[list[str], str, str]:
    (root / "empty.txt").write_bytes(b"")
    overrides = [*TEXT, "data.corpus.path=empty.txt", "data.corpus.split_by=bytes"]
    return overrides, str(root / "empty.txt"), "lower data.seq_len"


CASES: dict[str, Callable[[Path], tuple[list[str], str, str]]] = {
    "missing file": missing_file,
    "wrong checksum": wrong_checksum,
    "truncated archive": truncated_archive,
    "wrong image shape": wrong_image_shape,
    "corpus smaller than one sequence": corpus_too_small,
    "truncated catalogue": truncated_catalog,
    "empty file": empty_file,
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_data_gives_one_line_naming_the_file_and_the_fix(case: str, tmp_path: Path) -> None:
    root = tmp_path / "data"
    root.mkdir()
    overrides, file_name, fix = CASES[case](root)
    result = subprocess.run(
        [
            sys.executable,
            str(REPO / "train.py"),
            *QUICK,
            *overrides,
            f"data.root={root}",
            f"paths.log_dir={tmp_path}",
        ],
        cwd=tmp_path,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
        capture_output=True,
        text=True,
        timeout=180,
    )
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert file_name in lines[0] and fix in lines[0], lines[0]
