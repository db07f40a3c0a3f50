"""Any text dataset of the Hugging Face ``datasets`` library, encoded once into memory-mapped byte files.

``path`` is read the way ``datasets`` reads it:

- a folder written by ``save_to_disk`` (a ``DatasetDict`` or a single ``Dataset``);
- one data file or a folder of them: ``.parquet``, ``.arrow``, ``.json`` / ``.jsonl``, ``.csv``, ``.txt`` (a
  text file is one document), optionally compressed (``.gz``, ``.bz2``, ``.xz``, ``.zst``). In a folder, files
  are assigned to splits by ``datasets``' own name patterns (``train.jsonl``, ``my-train-00.parquet``,
  ``dev.csv``, ``test/*.txt``, ...); files no pattern matches form one ``train`` split;
- otherwise a hub name (``pg19``, with ``config``), which needs the network or the Hugging Face cache.

Relative paths resolve against the data root first, then the working directory. ``splits`` maps our
``train`` / ``validation`` / ``test`` to ``datasets`` split specs, slicing included (``train[:90%]``,
``train[-1000:]``, ``train[:5%]+test``). With ``splits=null`` the dataset's own ``train`` / ``validation`` /
``test`` are used, and a split the dataset lacks is cut from the end of ``train`` (``holdout`` of its documents
each; one line says so). Where that hold-out would be empty (a single ``.txt`` file is one document), the bytes
are split instead, ``holdout`` each for validation and test, as ``data=text_files`` splits one file.

Each split's documents (the ``text_field`` column) are written as UTF-8 with ``separator`` between them to
``$TVQ_CACHE_DIR/<cache>/<key>/<split>.bin`` (default ``~/.cache/tvq_exp``: a shared data root may be read-only;
a progress bar per split on a terminal, one line per split otherwise), next to a manifest ``<split>.json``:
SHA-256, XXH3 content digest, bytes, documents and every document's start offset (for resets at document
boundaries). ``load`` checks each file's content digest and memory-maps it, so a corpus larger than RAM (PG-19,
about 11 GB) is never read whole, a later run reuses the files, and a file edited since is refused.
``<key>`` is a hash of the source's content and of the options: the SHA-256 of every local data file's bytes,
the fingerprints ``datasets`` stores with a ``save_to_disk`` folder or gives a hub dataset. An edited file
therefore gets a new encoding, never a stale one; a renamed or moved one reuses its encoding.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any

import numpy as np

from tvq_exp.console import say
from tvq_exp.data.content import ALGORITHM, check_content
from tvq_exp.data.digests import CACHE_ENV, cache_dir
from tvq_exp.data.download import digest_file
from tvq_exp.data.paths import CorruptFileError, DataNotFoundError
from tvq_exp.data.text.corpus import SPLITS, ByteCorpus, Splits
from tvq_exp.data.text.encoded import encode_split, encoded, write_bytes
from tvq_exp.data.text.files import split_fractions
from tvq_exp.options import Between, OptionError, checked

FILE_BUILDERS = {
    ".parquet": "parquet",
    ".arrow": "arrow",
    ".json": "json",
    ".jsonl": "json",
    ".csv": "csv",
    ".txt": "text",
    ".text": "text",
}
COMPRESSIONS = (".gz", ".bz2", ".xz", ".zst")
BUILDER_OPTIONS = {"text": {"sample_by": "document"}}  # one text file is one document, its line breaks kept


class HFTextCorpus(ByteCorpus):
    """A ``datasets`` text corpus (module docstring). ``splits`` maps our ``train`` / ``validation`` / ``test``
    to ``datasets`` split specs (``null``: the dataset's own, with ``holdout`` cut from train where missing).
    ``load`` returns 1-D ``np.uint8`` memory maps of shape ``(bytes_in_split,)``."""

    name = "hf"

    @checked
    def __init__(
        self,
        path: str,
        config: str | None = None,
        text_field: str = "text",
        splits: Mapping[str, str] | None = None,
        holdout: Annotated[float, Between(0, 0.5, "()")] = 0.05,
        separator: str = "\n\n",
        cache: str = "hf_encoded",
    ) -> None:
        if not cache or Path(cache).name != cache or cache in (".", ".."):
            raise OptionError(
                "cache", cache, f"a folder name (under ${CACHE_ENV}, else ~/.cache/tvq_exp)", type(self)
            )
        self.path, self.config, self.text_field = path, config, text_field
        self.splits = dict(splits) if splits is not None else None
        if self.splits is not None and set(self.splits) != set(SPLITS):
            raise CorruptFileError(
                f"data.corpus.splits={self.splits}: give exactly train, validation and test (or null)"
            )
        self.holdout = holdout
        self.separator = separator.encode()
        self.cache = cache
        self._key: str | None = None

    # ------------------------------------------------------------------------------------------- source

    def source(self, root: Path) -> Path | None:
        """The local file or folder ``path`` names (data root first, then the working directory), or None
        for a hub name."""
        for candidate in (root / self.path, Path(self.path)):
            if candidate.exists():
                return candidate.resolve()
        return None

    def data_files(self, source: Path) -> list[Path]:
        """The data files of a local file or folder, sorted."""
        files = [source] if source.is_file() else sorted(p for p in source.rglob("*") if p.is_file())
        files = [p for p in files if _builder_suffix(p) is not None]
        if not files:
            raise DataNotFoundError(
                f"{source}: no {', '.join(FILE_BUILDERS)} files (optionally {', '.join(COMPRESSIONS)}) "
                "and no save_to_disk folder; set data.corpus.path"
            )
        return files

    def fingerprint(self, root: Path) -> str:
        """A hash of the source's content: data files' bytes, ``save_to_disk`` or hub fingerprints."""
        source = self.source(root)
        if source is not None and _saved_to_disk(source):
            states = sorted(source.rglob("state.json"))
            return _hash([str(p.relative_to(source)) for p in states] + [_fingerprint_of(p) for p in states])
        if source is not None:
            files = self.data_files(source)
            base = source if source.is_dir() else source.parent
            return _hash([[str(p.relative_to(base)), digest_file(p, "sha256")] for p in files])
        dataset = self._dataset(root)
        return _hash([self.path, self.config, {name: split._fingerprint for name, split in dataset.items()}])

    def folder(self, root: Path) -> Path:
        """Where this corpus's encoded splits live: ``$TVQ_CACHE_DIR/<cache>/<content and options hash>``."""
        if self._key is None:
            options = [self.text_field, self.splits, self.holdout, self.separator.hex()]
            self._key = _hash([self.fingerprint(root), options])[:16]
        return cache_dir() / self.cache / self._key

    # --------------------------------------------------------------------------------------- encoding

    def prepare(self, root: Path) -> None:
        folder = self.folder(root)
        if all(encoded(folder, split) for split in SPLITS):
            return
        with tempfile.TemporaryDirectory(dir=_mkdir(folder.parent), prefix="datasets-") as scratch:
            dataset = self._dataset(root, Path(scratch))
            folder.mkdir(parents=True, exist_ok=True)
            if self.splits is None and set(SPLITS) - set(dataset) and "train" in dataset:
                last = f"train[{100 - round(self.holdout * 100, 6):g}%:]"  # the smallest hold-out
                if len(select(dataset, last, self.path)) == 0:
                    return self.split_by_bytes(dataset, folder)
            specs = self.split_specs(dataset)
            for split in SPLITS:
                if not encoded(folder, split):
                    documents = select(dataset, specs[split], self.path)
                    encode_split(self._texts(documents), folder / f"{split}.bin", self.separator,
                                 f"{split} ({specs[split]})")  # fmt: skip

    def split_by_bytes(self, dataset: Mapping[str, Any], folder: Path) -> None:
        """Encode ``train``'s documents whole, then cut ``holdout`` of the bytes each for validation and test
        from its end (a hold-out of documents would be empty), saying so in one line."""
        say(f"data=hf: {self.path} has {len(dataset['train'])} document(s) and no validation or test split, too "
            f"few to hold out {self.holdout:g} of them: split by bytes (as data=text_files splits one file)")  # fmt: skip
        whole = folder / "whole.bin"
        encode_split(self._texts(dataset["train"]), whole, self.separator, "train (whole)")
        data = np.memmap(whole, dtype=np.uint8, mode="r") if whole.stat().st_size else np.zeros(0, np.uint8)
        for split, part in split_fractions(data, self.holdout, self.holdout).items():
            write_bytes(np.asarray(part), folder / f"{split}.bin")
        del data
        whole.unlink()
        whole.with_suffix(".json").unlink()

    def split_specs(self, dataset: Mapping[str, Any]) -> dict[str, str]:
        """Our split -> the ``datasets`` split spec it reads (``splits``, else the dataset's own names with
        ``holdout`` fractions of ``train`` standing in for the missing ones)."""
        if self.splits is not None:
            return self.splits
        if "train" not in dataset:
            raise DataNotFoundError(
                f"{self.path} has no split 'train' (it has {', '.join(dataset)}); set data.corpus.splits, "
                "e.g. {train: 'NAME[:90%]', validation: 'NAME[90%:95%]', test: 'NAME[95%:]'}"
            )
        missing = [split for split in ("validation", "test") if split not in dataset]
        if not missing:
            return {split: split for split in SPLITS}
        percent = round(self.holdout * 100, 6)
        cut = 100 - percent * len(missing)
        specs = {"train": f"train[:{cut:g}%]", "validation": "validation", "test": "test"}
        for index, split in enumerate(missing):
            start = cut + index * percent
            end = f"{start + percent:g}" if index < len(missing) - 1 else ""
            specs[split] = f"train[{start:g}%:{end}%]" if end else f"train[{start:g}%:]"
        say(f"data=hf: {self.path} has no {' or '.join(missing)} split; using "
            + ", ".join(f"{k} = {v}" for k, v in specs.items())
            + f" (data.corpus.holdout={self.holdout:g}, or set data.corpus.splits)")  # fmt: skip
        return specs

    def load(self, root: Path) -> Splits:
        folder = self.folder(root)
        splits = {}
        for split in SPLITS:
            if not encoded(folder, split):
                raise DataNotFoundError(
                    f"{folder / split}.bin is not encoded yet: prepare() the corpus first"
                )
            manifest = json.loads((folder / f"{split}.json").read_text())
            path = folder / f"{split}.bin"
            if path.stat().st_size != manifest["bytes"]:
                raise CorruptFileError(
                    f"{path} has {path.stat().st_size} bytes, its manifest says {manifest['bytes']}; "
                    f"delete {folder} to encode it again"
                )
            check_content(path, manifest[ALGORITHM], f"delete {folder} to encode it again")
            splits[split] = (
                np.memmap(path, dtype=np.uint8, mode="r")
                if manifest["bytes"]
                else np.empty(0, dtype=np.uint8)
            )
        return splits

    def _dataset(self, root: Path, scratch: Path | None = None) -> Any:
        """The dataset's splits as a mapping name -> ``datasets.Dataset``. Local files are converted to Arrow
        in ``scratch`` (deleted after encoding); hub datasets use the Hugging Face cache."""
        import datasets

        source = self.source(root)
        try:
            if source is not None and _saved_to_disk(source):
                loaded = datasets.load_from_disk(str(source))
                return loaded if isinstance(loaded, datasets.DatasetDict) else {"train": loaded}
            if source is not None:
                builder = self.builder(source)
                files = {"data_files": str(source)} if source.is_file() else {"data_dir": str(source)}
                return datasets.load_dataset(
                    builder, **files, **BUILDER_OPTIONS.get(builder, {}), cache_dir=scratch and str(scratch)
                )
            return datasets.load_dataset(self.path, self.config)
        except (FileNotFoundError, ConnectionError, ValueError) as error:
            message = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise DataNotFoundError(f"cannot load the dataset {self.path!r}: {message}") from error

    def builder(self, source: Path) -> str:
        """The ``datasets`` builder for a local file or folder: that of its most common data-file suffix."""
        counts = Counter(FILE_BUILDERS[_builder_suffix(p)] for p in self.data_files(source))
        return counts.most_common(1)[0][0]

    def _texts(self, split: Any) -> Iterable[str]:
        if self.text_field not in split.column_names:
            raise CorruptFileError(
                f"{self.path}: no column {self.text_field!r} (columns: {', '.join(split.column_names)}); "
                "set data.corpus.text_field"
            )
        return (row[self.text_field] for row in split)


def select(dataset: Mapping[str, Any], spec: str, path: str) -> Any:
    """The rows of ``dataset`` a ``datasets`` split spec names (``train``, ``train[:90%]``, ``a[:10]+b``)."""
    import datasets

    try:
        instructions = datasets.ReadInstruction.from_spec(spec).to_absolute(
            {name: len(split) for name, split in dataset.items()}
        )
    except (ValueError, KeyError, AssertionError) as error:
        raise DataNotFoundError(
            f"{path}: split {spec!r} is not one of {', '.join(dataset)} (slicing like 'train[:90%]' allowed): "
            f"{str(error).splitlines()[0] if str(error) else type(error).__name__}"
        ) from error
    parts = [dataset[i.splitname].select(range(i.from_, max(i.from_, i.to)) or []) for i in instructions]
    return parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)


def _builder_suffix(path: Path) -> str | None:
    """The data suffix of ``path`` (``.jsonl`` for ``a.jsonl.gz``), or None if no builder reads it."""
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] in COMPRESSIONS:
        suffixes.pop()
    return suffixes[-1] if suffixes and suffixes[-1] in FILE_BUILDERS else None


def _saved_to_disk(source: Path) -> bool:
    """Whether ``source`` is a ``save_to_disk`` folder (a ``DatasetDict`` or a single ``Dataset``)."""
    return source.is_dir() and any((source / name).is_file() for name in ("dataset_dict.json", "state.json"))


def _fingerprint_of(state: Path) -> str:
    """The fingerprint ``datasets`` recorded in a saved split's ``state.json``."""
    return str(json.loads(state.read_text()).get("_fingerprint"))


def _hash(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, default=str, sort_keys=True).encode()).hexdigest()


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


__all__ = ["HFTextCorpus", "select"]
