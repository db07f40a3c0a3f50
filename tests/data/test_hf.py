"""``data=hf``: a dataset built locally with ``datasets`` (no network) is encoded once into memory-mapped byte
files with a manifest, equals the same text read from files byte for byte, and is reused by a second run."""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

import datasets
import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from tests.helpers.paths import CONF
from tvq_exp.data.paths import CorruptFileError, DataNotFoundError
from tvq_exp.data.text.hf import HFTextCorpus
from tvq_exp.data.text.local import TextFilesCorpus
from tvq_exp.options import OptionError


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test's encodings in its own ``$TVQ_CACHE_DIR``."""
    monkeypatch.setenv("TVQ_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def documents() -> list[str]:
    """60 documents of real text (non-ASCII included), in file order."""
    rng = np.random.default_rng(0)
    words = "to be or not that is the question whether tis nobler in the mind café naïve".split()
    return [" ".join(rng.choice(words, size=int(rng.integers(20, 200)))) + f" — doc {i}" for i in range(60)]


def as_files_and_dataset(tmp_path: Path) -> tuple[Path, Path]:
    """The same documents as 60 text files and as a saved DatasetDict split like TextFilesCorpus splits files."""
    docs = documents()
    files = tmp_path / "files"
    files.mkdir()
    for i, text in enumerate(docs):
        (files / f"doc_{i:03d}.txt").write_text(text, encoding="utf-8")
    split_of = {"validation": docs[0::20], "test": docs[1::20]}
    split_of["train"] = [text for i, text in enumerate(docs) if i % 20 > 1]
    saved = tmp_path / "saved"
    datasets.DatasetDict(
        {k: datasets.Dataset.from_dict({"text": v}) for k, v in split_of.items()}
    ).save_to_disk(str(saved))
    return files, saved


def test_hf_corpus_equals_the_same_text_from_files_and_is_reused(tmp_path: Path) -> None:
    files, saved = as_files_and_dataset(tmp_path)
    root = tmp_path / "root"
    corpus = HFTextCorpus(str(saved))
    corpus.prepare(root)
    hf = corpus.load(root)
    reference = TextFilesCorpus(str(files)).load(root)
    for split in ("train", "validation", "test"):
        assert isinstance(hf[split], np.memmap)  # never read whole
        assert np.array_equal(np.asarray(hf[split]), reference[split]), split
        manifest = json.loads((corpus.folder(root) / f"{split}.json").read_text())
        assert manifest["bytes"] == len(reference[split])
        assert manifest["sha256"] == hashlib.sha256(reference[split].tobytes()).hexdigest()
        starts = manifest["offsets"]
        assert starts[0] == 0 and len(starts) == manifest["documents"]
        assert all(bytes(hf[split][s - 2 : s]) == b"\n\n" for s in starts[1:])  # every document starts there
    first = (corpus.folder(root) / "train.bin").stat().st_mtime_ns
    HFTextCorpus(str(saved)).prepare(root)  # a second run reuses the encoding
    assert (corpus.folder(root) / "train.bin").stat().st_mtime_ns == first


def joined(docs: list[str]) -> bytes:
    return "\n\n".join(docs).encode("utf-8")


def write(rows: list[str], path: Path, field: str = "text") -> None:
    """``rows`` as a data file in the format its suffix names (one text file per document for ``.txt``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    table = datasets.Dataset.from_dict({field: rows})
    writers = {".parquet": table.to_parquet, ".csv": table.to_csv, ".jsonl": table.to_json}
    if path.suffix == ".txt":
        for i, text in enumerate(rows):
            path.with_name(f"{path.stem}_{i:03d}.txt").write_text(text, encoding="utf-8")
    else:
        writers[path.suffix](str(path))


def loaded(corpus: HFTextCorpus, root: Path) -> dict[str, bytes]:
    corpus.prepare(root)
    return {split: bytes(np.asarray(data)) for split, data in corpus.load(root).items()}


def test_one_parquet_file_gets_the_documented_holdout_split(tmp_path: Path, capsys) -> None:
    docs = documents()  # 60 documents: train 54, validation 3, test 3 (holdout 0.05 each)
    write(docs, tmp_path / "all.parquet", field="body")
    splits = loaded(HFTextCorpus(str(tmp_path / "all.parquet"), text_field="body"), tmp_path / "root")
    assert splits == {
        "train": joined(docs[:54]),
        "validation": joined(docs[54:57]),
        "test": joined(docs[57:]),
    }
    (line,) = [line for line in capsys.readouterr().out.splitlines() if "no validation or test" in line]
    assert "validation = train[90%:95%], test = train[95%:]" in line
    with pytest.raises(CorruptFileError, match="no column 'text'"):
        HFTextCorpus(str(tmp_path / "all.parquet")).prepare(tmp_path / "other")


@pytest.mark.parametrize(
    "names",
    [
        ("train.jsonl", "validation.jsonl", "test.jsonl"),
        ("corpus-train.csv", "corpus-dev.csv", "corpus-test.csv"),  # datasets' patterns: dev = validation
        ("train/a.txt", "valid/a.txt", "test/a.txt"),  # folders named after splits, one document per file
        ("my_train-00.parquet", "my_validation-00.parquet", "my_test-00.parquet"),
    ],
)
def test_split_files_named_the_datasets_way(tmp_path: Path, names: tuple[str, str, str]) -> None:
    docs = documents()
    parts = {"train": docs[:40], "validation": docs[40:50], "test": docs[50:]}
    for rows, name in zip(parts.values(), names, strict=True):
        write(rows, tmp_path / "data" / name)
    splits = loaded(HFTextCorpus(str(tmp_path / "data")), tmp_path / "root")
    assert splits == {split: joined(rows) for split, rows in parts.items()}


def test_split_slicing_as_datasets_spells_it(tmp_path: Path) -> None:
    docs = documents()
    write(docs[:50], tmp_path / "data" / "train.jsonl")
    write(docs[50:], tmp_path / "data" / "test.jsonl")
    specs = {"train": "train[:80%]", "validation": "train[-10:]", "test": "test[:5]+train[40:41]"}
    splits = loaded(HFTextCorpus(str(tmp_path / "data"), splits=specs), tmp_path / "root")
    assert splits == {"train": joined(docs[:40]), "validation": joined(docs[40:50]),
                      "test": joined(docs[50:55] + docs[40:41])}  # fmt: skip
    with pytest.raises(DataNotFoundError, match="split 'dev'"):
        HFTextCorpus(str(tmp_path / "data"), splits={**specs, "validation": "dev"}).prepare(tmp_path / "r2")


def test_a_saved_single_dataset_and_a_missing_hub_name(tmp_path: Path, monkeypatch) -> None:
    docs = documents()
    datasets.Dataset.from_dict({"text": docs}).save_to_disk(str(tmp_path / "saved"))
    splits = loaded(HFTextCorpus(str(tmp_path / "saved"), holdout=0.1), tmp_path / "root")
    assert splits["validation"] == joined(docs[48:54]) and splits["test"] == joined(docs[54:])
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DataNotFoundError, match="cannot load the dataset 'no-such/dataset-xyz'"):
        HFTextCorpus("no-such/dataset-xyz").prepare(tmp_path / "root")


def test_the_cache_is_keyed_by_content_not_by_name(tmp_path: Path) -> None:
    docs = documents()
    write(docs, tmp_path / "a" / "train.jsonl")
    root = tmp_path / "root"
    first = HFTextCorpus(str(tmp_path / "a"))
    first.prepare(root)
    (tmp_path / "a").rename(tmp_path / "b")  # moved: same bytes, same encoding
    assert HFTextCorpus(str(tmp_path / "b")).folder(root) == first.folder(root)
    write(
        docs[:59] + [docs[59].replace("doc", "dog")], tmp_path / "b" / "train.jsonl"
    )  # same size, new bytes
    edited = HFTextCorpus(str(tmp_path / "b"))
    assert edited.folder(root) != first.folder(root)
    assert loaded(edited, root)["test"].endswith(b"dog 59")
    assert HFTextCorpus(str(tmp_path / "b"), text_field="body").folder(root) != edited.folder(root)


def test_data_hf_trains_from_the_encoded_files(tmp_path: Path) -> None:
    _, saved = as_files_and_dataset(tmp_path)
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=["experiment=smoke", "data=hf", f"data.corpus.path={saved}",
                                          f"data.root={tmp_path / 'root'}"])  # fmt: skip
    module = instantiate(cfg.data)
    module.prepare_data()
    module.setup("fit")
    batch = next(iter(module.train_dataloader()))
    assert batch["input"].shape == (cfg.data.batch_size, cfg.data.seq_len)


@pytest.mark.parametrize("name", ["book.txt", "book.txt.gz"])
def test_one_text_file_is_split_by_bytes_and_said_so(tmp_path: Path, name: str, capsys) -> None:
    """A single .txt (.txt.gz) file is one document: a 5% hold-out of documents is empty (a 90-line IndexError),
    so the bytes are split 90/5/5 as data=text_files splits one file, and one line says so."""
    text = joined(documents()).decode()
    path = tmp_path / "data" / name
    path.parent.mkdir()
    (gzip.open if name.endswith(".gz") else open)(path, "wt", encoding="utf-8").write(text)
    splits = loaded(HFTextCorpus(str(path)), tmp_path / "root")
    reference = TextFilesCorpus(str(tmp_path / "plain.txt"), split_by="bytes")
    (tmp_path / "plain.txt").write_text(text, encoding="utf-8")
    assert splits == {split: bytes(data) for split, data in reference.load(tmp_path).items()}
    said = [line for line in capsys.readouterr().out.splitlines() if "split by bytes" in line]
    assert len(said) == 1 and "1 document(s)" in said[0]


def test_encodings_go_to_the_cache_dir_never_the_data_root(tmp_path: Path, cache: Path, capsys) -> None:
    """A shared data root may be read-only: the encoded splits live under $TVQ_CACHE_DIR, nothing is written
    under the data root; without a terminal, each split is one line, no progress bar ("0 docs" in a log)."""
    (tmp_path / "root").mkdir()
    as_files_and_dataset(tmp_path / "root")
    before = sorted((tmp_path / "root").rglob("*"))
    corpus = HFTextCorpus("saved")  # relative: under the data root
    corpus.prepare(tmp_path / "root")
    assert corpus.folder(tmp_path / "root").parent == cache / "hf_encoded"
    assert sorted((tmp_path / "root").rglob("*")) == before
    out, err = capsys.readouterr()
    assert "docs" not in err and [line.split(":")[1] for line in out.splitlines() if "encoded" in line] == [
        " encoded train (train)",
        " encoded validation (validation)",
        " encoded test (test)",
    ]
    with pytest.raises(OptionError, match="cache='../elsewhere': a folder name"):
        HFTextCorpus("saved", cache="../elsewhere")


def test_an_encoding_edited_in_place_is_refused(tmp_path: Path) -> None:
    """Same size, new bytes: the content digest recorded at encoding differs, the run stops in one line."""
    _, saved = as_files_and_dataset(tmp_path)
    corpus = HFTextCorpus(str(saved))
    corpus.prepare(tmp_path / "root")
    target = corpus.folder(tmp_path / "root") / "validation.bin"
    data = bytearray(target.read_bytes())
    data[10] ^= 1
    target.write_bytes(bytes(data))
    with pytest.raises(
        CorruptFileError, match=r"validation.bin: content digest xxh3_64 \w+ differs .* delete "
    ):
        corpus.load(tmp_path / "root")
