"""The shared Project Gutenberg books, split by their catalogue."""

from __future__ import annotations

import csv
import hashlib
import io
import re
from pathlib import Path, PurePosixPath

from tvq_exp.data.paths import CorruptFileError, not_found, resolve
from tvq_exp.data.text.corpus import SPLITS, ByteCorpus, Splits
from tvq_exp.data.text.files import concat_files

CATALOG_COLUMNS = ("file", "split", "bytes")
SHA256 = re.compile("[0-9a-f]{64}")


class GutenbergCorpus(ByteCorpus):
    """The shared Gutenberg folder: splits from ``CATALOG.tsv``'s ``split`` column.

    Each split is its books concatenated in sorted file-name order with ``separator`` between them. Every
    book's size is checked against the catalogue's ``bytes`` column and its SHA-256 against the ``sha256`` column
    (computed from the bytes on every load: no cache, no mtime shortcut), and every book must be UTF-8 text
    throughout. Catalogue rows are unique relative paths inside the folder; the catalogue is UTF-8. A book in the
    folder that the catalogue does not list (a deleted row) is refused, and with ``catalog_sha256`` the catalogue
    itself must have that digest (a truncated or edited catalogue).
    """

    name = "gutenberg"

    def __init__(
        self,
        path: str = "text/gutenberg",
        separator: str = "\n\n",
        catalog: str = "CATALOG.tsv",
        catalog_sha256: str | None = None,
    ) -> None:
        self.path = path
        self.separator = separator.encode()
        self.catalog = catalog
        self.catalog_sha256 = catalog_sha256

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
        raw = catalog.read_bytes()
        if self.catalog_sha256 and hashlib.sha256(raw).hexdigest() != self.catalog_sha256.lower():
            raise CorruptFileError(
                f"{catalog}: sha256 {hashlib.sha256(raw).hexdigest()} is not the catalogue's "
                f"{self.catalog_sha256.lower()}; it is truncated or edited: restore it (or set "
                "data.corpus.catalog_sha256=null for a catalogue of your own)"
            )
        text = _utf8(raw, catalog)
        files: dict[str, list[Path]] = {split: [] for split in SPLITS}
        reader = csv.DictReader(io.StringIO(text, newline=""), delimiter="\t", quoting=csv.QUOTE_NONE)
        missing = [c for c in CATALOG_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise CorruptFileError(f"{catalog}: no column {', '.join(missing)}; restore the catalogue")
        seen: dict[str, int] = {}
        for line, row in enumerate(reader, start=2):
            digest = row.get("sha256")
            if (
                any(not row.get(c) for c in CATALOG_COLUMNS)
                or not str(row["bytes"]).isdigit()
                or (digest is not None and not SHA256.fullmatch(digest.lower()))
            ):
                raise CorruptFileError(
                    f"{catalog}, line {line}: incomplete row {row.get('file')!r} (needs file, split, a byte "
                    "count and, in a sha256 column, 64 hex digits); the catalogue is truncated or edited: restore it"
                )
            if row["split"] not in files:
                raise CorruptFileError(f"{catalog}: unknown split {row['split']!r} for {row['file']}")
            if row["file"] in seen:
                raise CorruptFileError(
                    f"{catalog}, line {line}: {row['file']!r} is listed again (first on line {seen[row['file']]}); "
                    "each book is listed once: restore the catalogue"
                )
            seen[row["file"]] = line
            book = self._checked_book(_inside(folder, row["file"], catalog, line), int(row["bytes"]), root)
            _check_book_content(book, row.get("sha256"))
            files[row["split"]].append(book)
        listed = {path.name for paths in files.values() for path in paths}
        unlisted = sorted(path.name for path in folder.glob("*.txt") if path.name not in listed)
        if unlisted:
            raise CorruptFileError(
                f"{catalog} does not list {', '.join(unlisted[:3])}{' ...' if len(unlisted) > 3 else ''} "
                f"({len(unlisted)} book(s) in the folder): the catalogue is truncated or edited: restore it"
            )
        empty = [split for split, paths in files.items() if not paths]
        if empty:
            raise CorruptFileError(
                f"{catalog}: no book in the {', '.join(empty)} split; restore the catalogue"
            )
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


def _utf8(data: bytes, path: Path) -> str:
    """``data`` decoded as UTF-8, with no NUL byte anywhere: :class:`CorruptFileError` naming the offset."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise CorruptFileError(
            f"{path} is not valid UTF-8 (byte {error.start}: {data[error.start : error.start + 4]!r}); a catalogue "
            "and its books are UTF-8 text throughout: restore the file"
        ) from None
    if "\0" in text:
        raise CorruptFileError(
            f"{path} holds a NUL byte at character {text.index(chr(0))}; a catalogue and its books are text "
            "throughout: restore the file"
        )
    return text


def _inside(folder: Path, name: str, catalog: Path, line: int) -> Path:
    """The book ``name`` of a catalogue row: a relative path inside ``folder`` (no ``..``, no link out of it)."""
    given = PurePosixPath(name)
    path = folder / name
    inside = not given.is_absolute() and ".." not in given.parts and "\\" not in name
    if not inside or not path.resolve().is_relative_to(folder.resolve()):
        raise CorruptFileError(
            f"{catalog}, line {line}: file {name!r} is not a relative path inside {folder}; a catalogue lists only "
            "the books of its own folder: restore it"
        )
    return path


def _check_book_content(book: Path, sha256: str | None) -> None:
    """The book's bytes, read now (no cached digest): the catalogue's SHA-256 when it has one, UTF-8 throughout."""
    data = book.read_bytes()
    if sha256 and hashlib.sha256(data).hexdigest() != sha256.lower():
        raise CorruptFileError(
            f"{book}: sha256 {hashlib.sha256(data).hexdigest()} differs from CATALOG.tsv's {sha256.lower()}; "
            "the book was edited or damaged: restore it"
        )
    _utf8(data, book)
