"""``data=hf``: a dataset built locally with ``datasets`` (no network) is encoded once into memory-mapped byte
files with a manifest, equals the same text read from files byte for byte, and is reused by a second run."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import datasets
import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from tests.helpers.paths import CONF
from tvq_exp.data.paths import DataNotFoundError
from tvq_exp.data.text.hf import HFTextCorpus
from tvq_exp.data.text.local import TextFilesCorpus


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


def test_parquet_files_and_split_names(tmp_path: Path) -> None:
    docs = documents()
    folder = tmp_path / "parquet"
    folder.mkdir()
    datasets.Dataset.from_dict({"body": docs}).to_parquet(str(folder / "all.parquet"))
    corpus = HFTextCorpus(str(folder), text_field="body", splits={"train": "train", "validation": "train",
                                                                  "test": "train"})  # fmt: skip
    corpus.prepare(tmp_path / "root")
    train = corpus.load(tmp_path / "root")["train"]
    assert bytes(train) == "\n\n".join(docs).encode("utf-8")
    with pytest.raises(Exception, match="no column 'text'"):
        HFTextCorpus(str(folder)).prepare(tmp_path / "other")
    with pytest.raises(DataNotFoundError, match="no split 'validation'"):
        HFTextCorpus(str(folder), text_field="body").prepare(tmp_path / "third")


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
