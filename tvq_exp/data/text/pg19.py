"""PG-19 books in the official folder layout (or fetched once from the Hugging Face hub)."""

from __future__ import annotations

import os
import shutil
import socket
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlparse

from tvq_exp.data.paths import DataNotFoundError, not_found, resolve
from tvq_exp.data.text.corpus import SPLITS, ByteCorpus, Splits
from tvq_exp.data.text.files import concat_files


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

        folder = resolve(self.path, root)
        if not (folder / ".hf_cache").is_dir():
            check_hub_reachable()
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


def check_hub_reachable(timeout_s: float = 3.0) -> None:
    """Raise ``ConnectionError`` at once when ``HF_HUB_OFFLINE`` is set or the hub's host cannot be reached in
    ``timeout_s`` (``datasets`` would retry for half a minute, a line per try, before failing the same way)."""
    import huggingface_hub.constants

    if huggingface_hub.constants.HF_HUB_OFFLINE:
        raise ConnectionError("HF_HUB_OFFLINE is set")
    endpoint = urlparse(huggingface_hub.constants.ENDPOINT)
    port = endpoint.port or (443 if endpoint.scheme == "https" else 80)
    try:
        socket.create_connection((endpoint.hostname, port), timeout=timeout_s).close()
    except OSError as error:
        raise ConnectionError(f"cannot reach {endpoint.hostname}:{port} (offline?): {error}") from None
