"""enwik8 and text8: one 100M-byte file (raw, ``.zip`` or ``.gz``), downloaded with its checksum if missing."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse

import numpy as np

from tvq_exp.data.download import check_digest, digest_bytes, download
from tvq_exp.data.paths import DataNotFoundError, first_file, not_found
from tvq_exp.data.text.corpus import ByteCorpus, Splits
from tvq_exp.data.text.files import read_bytes, split_held_out


class MahoneyCorpus(ByteCorpus):
    """enwik8 / text8 style corpus: one 100M-byte file, raw or ``.zip``/``.gz``.

    Looked for as ``<root>/<name>{,.zip,.gz}`` and ``<root>/<name>/<name>{,.zip,.gz}``; when absent and
    ``download`` is on, ``url`` is fetched into ``<root>/<name>/``. ``md5`` and ``sha256`` are digests of the
    *decompressed* corpus, checked on download and on every load (``None`` skips one).
    """

    def __init__(
        self, name: str, url: str, md5: str | None = None, sha256: str | None = None, download: bool = True
    ) -> None:
        self.name = name
        self.url = url
        self.md5 = md5
        self.sha256 = sha256
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
        """Compare the decompressed bytes with ``md5`` and ``sha256``."""
        for algorithm, expected in (("md5", self.md5), ("sha256", self.sha256)):
            if expected:
                actual = digest_bytes(memoryview(data), algorithm)
                check_digest(f"{path} (decompressed {self.name})", actual, expected, algorithm)

    def _missing(self, root: Path) -> DataNotFoundError:
        return not_found(
            self.name,
            self.candidates(root),
            f"download {self.url} and put it at {self.download_target(root)}, or set download: true "
            "and let prepare_data() fetch it",
            root,
        )
