"""Downloads through the real code path, from a local HTTP server on 127.0.0.1."""

from __future__ import annotations

import functools
import hashlib
import http.server
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tvq_exp.data import ChecksumError, CorruptFileError, DataNotFoundError, TextDataModule, download
from tvq_exp.data.text import MahoneyCorpus


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        """Keep the test output clean."""


@pytest.fixture()
def served(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """``(base URL, folder it serves)``."""
    folder = tmp_path / "www"
    folder.mkdir()
    handler = functools.partial(_QuietHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", folder
    server.shutdown()
    server.server_close()
    thread.join()


def _small_enwik8(folder: Path, size: int = 4000) -> bytes:
    content = np.random.default_rng(0).integers(32, 127, size, dtype=np.uint8).tobytes()
    with zipfile.ZipFile(folder / "enwik8.zip", "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("enwik8", content)
    return content


def _module(url: str, md5: str | None, root: Path) -> TextDataModule:
    return TextDataModule(MahoneyCorpus("enwik8", url, md5=md5), seq_len=16, batch_size=2, root=str(root))


def test_enwik8_download_checks_and_splits(served: tuple[str, Path], tmp_path: Path) -> None:
    base, folder = served
    content = _small_enwik8(folder)
    root = tmp_path / "data"
    module = _module(f"{base}/enwik8.zip", hashlib.md5(content).hexdigest(), root)
    assert not root.exists(), "constructing the DataModule touches no file"
    module.prepare_data()
    target = root / "enwik8" / "enwik8.zip"
    assert target.is_file() and not target.with_name("enwik8.zip.part").exists()
    module.setup("fit")
    train, val, test = (module.split(s) for s in ("train", "validation", "test"))
    assert (len(train), len(val), len(test)) == (3600, 200, 200)
    assert train.tobytes() + val.tobytes() + test.tobytes() == content
    module.prepare_data()  # already there: no second download
    assert target.stat().st_size == (folder / "enwik8.zip").stat().st_size


def test_wrong_checksum_is_rejected_and_leaves_no_file(served: tuple[str, Path], tmp_path: Path) -> None:
    base, folder = served
    content = _small_enwik8(folder)
    root = tmp_path / "data"
    with pytest.raises(ChecksumError) as error:
        _module(f"{base}/enwik8.zip", "0" * 32, root).prepare_data()
    message = str(error.value)
    assert "enwik8.zip" in message and "0" * 32 in message and hashlib.md5(content).hexdigest() in message
    assert not root.exists(), "a failed download leaves no folder in the data root"


def test_truncated_zip_is_refused(served: tuple[str, Path], tmp_path: Path) -> None:
    base, folder = served
    _small_enwik8(folder)
    whole = (folder / "enwik8.zip").read_bytes()
    (folder / "enwik8.zip").write_bytes(whole[: len(whole) // 2])
    root = tmp_path / "data"
    with pytest.raises(CorruptFileError, match=r"enwik8\.zip\.part is truncated or corrupt"):
        _module(f"{base}/enwik8.zip", None, root).prepare_data()
    assert not (root / "enwik8" / "enwik8.zip").exists()
    local = tmp_path / "local"
    local.mkdir()
    (local / "enwik8.zip").write_bytes(whole[:-40])
    with pytest.raises(CorruptFileError, match=str(local / "enwik8.zip")):
        _module(f"{base}/enwik8.zip", None, local).setup("fit")


def test_truncated_gz_is_refused(tmp_path: Path) -> None:
    import gzip

    data = gzip.compress(b"abc" * 10_000)
    (tmp_path / "enwik8.gz").write_bytes(data[: len(data) // 2])
    with pytest.raises(CorruptFileError, match=r"enwik8\.gz is truncated or corrupt"):
        _module("http://127.0.0.1:9/enwik8.zip", None, tmp_path).setup("fit")


def test_download_verifies_sha256(served: tuple[str, Path], tmp_path: Path) -> None:
    base, folder = served
    payload = b"tvq" * 1000
    (folder / "blob.bin").write_bytes(payload)
    good = download(
        f"{base}/blob.bin", tmp_path / "blob.bin", sha256=hashlib.sha256(payload).hexdigest(), progress=False
    )
    assert good.read_bytes() == payload
    with pytest.raises(ChecksumError, match="sha256 mismatch"):
        download(f"{base}/blob.bin", tmp_path / "other.bin", sha256="f" * 64)
    assert not (tmp_path / "other.bin").exists() and not (tmp_path / "other.bin.part").exists()


def test_unreachable_url_says_where_to_put_the_file(served: tuple[str, Path], tmp_path: Path) -> None:
    base, _ = served
    with pytest.raises(DataNotFoundError, match=r"could not download .*missing\.zip") as error:
        download(f"{base}/missing.zip", tmp_path / "missing.zip")
    assert str(tmp_path / "missing.zip") in str(error.value)
    assert not (tmp_path / "missing.zip.part").exists()
    root = tmp_path / "data"  # the case: an enwik8 download that fails leaves no empty folder
    with pytest.raises(DataNotFoundError):
        _module(f"{base}/missing.zip", None, root).prepare_data()
    assert not root.exists()
    root.mkdir()  # a data root that was there stays, and keeps what it held
    (root / "kept.txt").write_text("x")
    with pytest.raises(DataNotFoundError):
        _module(f"{base}/missing.zip", None, root).prepare_data()
    assert sorted(p.name for p in root.iterdir()) == ["kept.txt"]
