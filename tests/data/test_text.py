"""Byte corpora, samplers and the text DataModule, on the real shared corpora under $TVQ_DATA_DIR."""

from __future__ import annotations

import csv
import hashlib
import time
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from hydra.utils import instantiate

from tests.helpers.config import compose_config, data_preset, train_run
from tests.helpers.paths import CONF as CONF_ROOT
from tvq_exp.batch import IGNORE_INDEX
from tvq_exp.data import DataNotFoundError, TextDataModule
from tvq_exp.data.paths import CorruptFileError
from tvq_exp.data.samplers import EvalSegmentSampler, RandomWindowSampler, StreamSampler
from tvq_exp.data.text import GutenbergCorpus, MahoneyCorpus, PG19Corpus, TextFilesCorpus
from tvq_exp.data.text.embedded import EMBEDDED, SHA256

CONF = CONF_ROOT / "data"


SEQ_LEN = 128


@pytest.fixture(scope="module")
def gutenberg(data_dir: Path) -> TextDataModule:
    cfg = data_preset("gutenberg")
    cfg.seq_len, cfg.batch_size, cfg.eval_batch_size = SEQ_LEN, 8, 8
    module = instantiate(cfg)
    module.prepare_data()
    module.setup("fit")
    return module


def catalog_rows(data_dir: Path) -> list[dict[str, str]]:
    with open(data_dir / "text/gutenberg/CATALOG.tsv", newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))


# ----------------------------------------------------------------------------------------------- corpora


def test_gutenberg_splits_match_catalog(gutenberg: TextDataModule, data_dir: Path) -> None:
    rows = catalog_rows(data_dir)
    books = {
        split: sorted(r["file"] for r in rows if r["split"] == split)
        for split in ("train", "validation", "test")
    }
    assert {split: len(names) for split, names in books.items()} == {
        "train": 211,
        "validation": 12,
        "test": 12,
    }
    sizes = {r["file"]: int(r["bytes"]) for r in rows}
    for split, names in books.items():
        data = gutenberg.split(split)
        assert data.dtype == np.uint8 and data.ndim == 1
        assert len(data) == sum(sizes[name] for name in names) + 2 * (len(names) - 1)
        first, second = names[0], names[1]
        first_bytes = (data_dir / "text/gutenberg" / first).read_bytes()
        second_bytes = (data_dir / "text/gutenberg" / second).read_bytes()
        assert data[: len(first_bytes)].tobytes() == first_bytes
        boundary = len(first_bytes)
        assert data[boundary : boundary + 2].tobytes() == b"\n\n"
        assert data[boundary + 2 : boundary + 2 + len(second_bytes)].tobytes() == second_bytes


def test_text_files_by_file_reproduces_catalog_split(gutenberg: TextDataModule, data_dir: Path) -> None:
    splits = TextFilesCorpus(path="text/gutenberg", split_by="file").load(data_dir)
    for split in ("validation", "test"):
        assert np.array_equal(splits[split], gutenberg.split(split))
    assert len(splits["train"]) == len(gutenberg.split("train"))


def test_text_files_by_bytes_single_file(data_dir: Path) -> None:
    splits = TextFilesCorpus(path="text/tinyshakespeare.txt", split_by="bytes").load(data_dir)
    n = (data_dir / "text/tinyshakespeare.txt").stat().st_size
    assert [len(splits[s]) for s in ("train", "validation", "test")] == [n * 9 // 10, 55771, 55769]
    assert sum(len(part) for part in splits.values()) == n


def test_text_files_on_one_file_splits_by_bytes_says_so_and_trains(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = data_dir / "text/tinyshakespeare.txt"
    by_bytes = TextFilesCorpus(path=str(path), split_by="bytes").load(data_dir)
    default = TextFilesCorpus(path=str(path)).load(data_dir)  # split_by=file, the preset's default
    assert all(np.array_equal(default[s], by_bytes[s]) for s in by_bytes)
    assert capsys.readouterr().out == (
        f"data=text_files: {path} is one file: split by bytes 90/5/5 (data.corpus.split_by=bytes)\n"
    )
    overrides = ["experiment=smoke", "data=text_files", f"data.corpus.path={path}", "trainer.max_steps=2",
                 "trainer.val_check_interval=1000", "logger=none", "callbacks=none"]  # fmt: skip
    result = train_run(overrides, tmp_path)
    assert result["global_step"] == 2 and 0 < result["val"]["bpb"] < 9


@pytest.mark.parametrize("count", [1, 2])
def test_text_files_on_a_folder_of_fewer_than_3_files_splits_by_bytes(
    tmp_path: Path, count: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """Fewer files than splits cannot be split by file (a traceback before): the bytes are, and one line says so."""
    for index in range(count):
        (tmp_path / "books" / f"{index}.txt").parent.mkdir(exist_ok=True)
        (tmp_path / "books" / f"{index}.txt").write_text(f"book {index} " * 400)
    splits = TextFilesCorpus(path="books").load(tmp_path)
    by_bytes = TextFilesCorpus(path="books", split_by="bytes").load(tmp_path)
    assert all(np.array_equal(splits[s], by_bytes[s]) and len(splits[s]) for s in by_bytes)
    assert capsys.readouterr().out == (
        f"data=text_files: {tmp_path / 'books'} holds {count} files, fewer than one per split: "
        "split by bytes 90/5/5 (data.corpus.split_by=bytes)\n"
    )


def test_shakespeare_and_kjv(data_dir: Path) -> None:
    shakespeare = instantiate(data_preset("shakespeare"))
    shakespeare.setup("fit")
    assert len(shakespeare.split("train")) == 1_003_854 and len(shakespeare.split("validation")) == 111_540
    assert shakespeare.split("test") is shakespeare.split("validation")
    kjv = instantiate(data_preset("kjv"))
    kjv.setup("fit")
    test, val, train = kjv.split("test"), kjv.split("validation"), kjv.split("train")
    assert test[:7].tobytes() == b"Jude 1\n"
    assert val[-1] == ord("\n") and len(val) == int((len(train) + len(val)) * 0.05)
    assert len(train) + len(val) + len(test) == (data_dir / "text/kjv_bible.txt").stat().st_size


def test_missing_files_raise_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(DataNotFoundError) as error:
        MahoneyCorpus("enwik8", "http://127.0.0.1:9/enwik8.zip", download=False).prepare(tmp_path)
    message = str(error.value)
    assert str(tmp_path / "enwik8.zip") in message and str(tmp_path / "enwik8" / "enwik8.gz") in message
    assert "TVQ_DATA_DIR" in message and "download" in message
    with pytest.raises(DataNotFoundError, match="PG-19") as error:
        PG19Corpus(hub=False).prepare(tmp_path)
    assert str(tmp_path / "pg19" / "validation") in str(error.value)
    with pytest.raises(DataNotFoundError, match="CATALOG.tsv"):
        GutenbergCorpus().load(tmp_path)


def test_pg19_official_layout(tmp_path: Path) -> None:
    for split, count in (("train", 3), ("validation", 2), ("test", 2)):
        (tmp_path / "pg19" / split).mkdir(parents=True)
        for index in range(count):
            (tmp_path / "pg19" / split / f"{100 + index}.txt").write_bytes(
                f"{split} book {index}\r\n".encode() * 50
            )
    splits = PG19Corpus(hub=False).load(tmp_path)
    book = b"validation book 0\r\n" * 50
    assert splits["validation"][: len(book)].tobytes() == book
    assert splits["validation"][len(book) : len(book) + 2].tobytes() == b"\n\n"
    assert len(splits["train"]) == 3 * len("train book 0\r\n") * 50 + 4
    assert list(tmp_path.joinpath("pg19").glob("train-*.bin")), (
        "the concatenation is cached inside the data root"
    )
    again = PG19Corpus(hub=False).load(tmp_path)
    assert np.array_equal(again["train"], splits["train"])
    del splits, again
    (cached,) = tmp_path.joinpath("pg19").glob("train-*.bin")
    data = bytearray(cached.read_bytes())
    data[3] ^= 1  # edited in place: same size, same inputs
    cached.write_bytes(bytes(data))
    with pytest.raises(CorruptFileError, match=r"train-\w+\.bin: content digest xxh3_64 \w+ differs"):
        PG19Corpus(hub=False).load(tmp_path)


def test_pg19_offline_fails_at_once_without_retries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With no way to the hub, prepare() says so at once, before ``datasets`` retries for half a minute."""
    import datasets
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: pytest.fail("the hub was tried"))
    start = time.perf_counter()
    with pytest.raises(DataNotFoundError, match=r"cannot reach 127\.0\.0\.1:9 \(offline\?\)"):
        PG19Corpus().prepare(tmp_path)
    assert time.perf_counter() - start < 5
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(DataNotFoundError, match="HF_HUB_OFFLINE is set"):
        PG19Corpus().prepare(tmp_path)


def test_split_smaller_than_window_is_refused(tmp_path: Path) -> None:
    (tmp_path / "tiny.txt").write_bytes(b"x" * 1000)
    module = TextDataModule(TextFilesCorpus("tiny.txt", split_by="bytes"), seq_len=60, root=str(tmp_path))
    with pytest.raises(ValueError, match=r"split 'validation' has 50 bytes, fewer than seq_len \+ 1 = 61"):
        module.setup("fit")


# ----------------------------------------------------------------------------------------------- samplers


def test_random_windows_are_shifted_slices(gutenberg: TextDataModule) -> None:
    train = gutenberg.split("train")
    batch = next(iter(gutenberg.train_dataloader()))
    assert batch["input"].shape == batch["target"].shape == (8, SEQ_LEN)
    assert batch["input"].dtype == batch["target"].dtype == torch.int64 and bool(batch["reset"].all())
    assert torch.equal(batch["target"][:, :-1], batch["input"][:, 1:])
    raw = train.tobytes()
    for row in range(2):
        window = bytes(batch["input"][row].tolist()) + bytes([int(batch["target"][row, -1])])
        assert raw.find(window) >= 0
    again = next(iter(gutenberg.train_dataloader()))
    assert torch.equal(again["input"], batch["input"]), "same seed, rank and epoch give the same windows"
    other_rank = next(iter(RandomWindowSampler(train, SEQ_LEN, 8, 10, seed=0, rank=1, world_size=2)))
    assert not torch.equal(other_rank["input"], batch["input"])


def test_stream_sampler_rows_are_contiguous(gutenberg: TextDataModule) -> None:
    train = gutenberg.split("train")
    sampler = StreamSampler(train, SEQ_LEN, batch_size=4, seed=3)
    iterator = iter(sampler)
    batches = [next(iterator) for _ in range(3)]
    starts = sampler.stream_starts()
    assert 0 <= sampler.offset < SEQ_LEN
    assert [bool(b["reset"].all()) for b in batches] == [True, False, False]
    assert not any(bool(b["reset"].any()) for b in batches[1:])
    for row, start in enumerate(starts):
        inputs = torch.cat([b["input"][row] for b in batches])
        targets = torch.cat([b["target"][row] for b in batches])
        expected = torch.from_numpy(train[start : start + 3 * SEQ_LEN + 1].astype(np.int64))
        assert torch.equal(inputs, expected[:-1]) and torch.equal(targets, expected[1:])
    assert len(sampler) == (sampler.stream_len - 1) // SEQ_LEN
    assert starts[1] - starts[0] == sampler.stream_len == (len(train) - SEQ_LEN + 1) // 4


def test_ddp_ranks_get_disjoint_streams(gutenberg: TextDataModule) -> None:
    train = gutenberg.split("train")
    world = 3
    samplers = [
        StreamSampler(train, SEQ_LEN, batch_size=2, seed=1, rank=rank, world_size=world)
        for rank in range(world)
    ]
    intervals = sorted(
        (int(s), int(s) + sampler.stream_len) for sampler in samplers for s in sampler.stream_starts()
    )
    assert len(intervals) == 6
    assert all(end <= next_start for (_, end), (next_start, _) in zip(intervals, intervals[1:], strict=False))
    assert len({len(sampler) for sampler in samplers}) == 1, "every rank runs the same number of steps"
    firsts = [next(iter(sampler))["input"] for sampler in samplers]
    assert not torch.equal(firsts[0], firsts[1])


def test_stream_state_dict_resume_is_exact(gutenberg: TextDataModule) -> None:
    data = gutenberg.split("validation")[:200_000]
    original = StreamSampler(data, SEQ_LEN, batch_size=4, seed=7)
    steps = len(original)
    list(original)  # epoch 0
    iterator = iter(original)
    for _ in range(5):
        next(iterator)
    state = original.state_dict()
    expected = list(iterator) + [next(iter(original)) for _ in range(1)]
    resumed = StreamSampler(data, SEQ_LEN, batch_size=4, seed=7)
    resumed.load_state_dict(state)
    resumed_iter = iter(resumed)
    got = list(resumed_iter) + [next(iter(resumed)) for _ in range(1)]
    assert len(got) == steps - 5 + 1
    for a, b in zip(expected, got, strict=True):
        assert all(torch.equal(a[key], b[key]) for key in ("input", "target", "reset"))
    assert resumed.offset == original.offset, "the next epoch's offset comes from the restored generator"
    fresh = StreamSampler(data, SEQ_LEN, batch_size=4, seed=7)
    assert not torch.equal(next(iter(fresh))["input"], got[0]["input"])


def test_random_window_state_dict_resume(gutenberg: TextDataModule) -> None:
    data = gutenberg.split("validation")
    original = RandomWindowSampler(data, SEQ_LEN, 4, steps_per_epoch=6, seed=5)
    iterator = iter(original)
    for _ in range(2):
        next(iterator)
    resumed = RandomWindowSampler(data, SEQ_LEN, 4, steps_per_epoch=6, seed=5)
    resumed.load_state_dict(original.state_dict())
    for a, b in zip(iterator, resumed, strict=True):
        assert torch.equal(a["input"], b["input"])


@pytest.mark.parametrize("world_size", [1, 3])
def test_eval_covers_every_target_exactly_once(gutenberg: TextDataModule, world_size: int) -> None:
    data = gutenberg.split("test")
    streams = gutenberg.eval_batch_size
    samplers = [
        EvalSegmentSampler(data, 4096, streams, rank, world_size, "split") for rank in range(world_size)
    ]
    assert len({len(s) for s in samplers}) == 1 and len({len(s.starts) for s in samplers}) == 1
    inputs: dict[int, list[np.ndarray]] = {}
    targets: dict[int, list[np.ndarray]] = {}
    counted = 0
    for sampler in samplers:
        for segment, batch in enumerate(sampler):
            assert batch["input"].shape == (len(sampler.starts), 4096)
            assert bool((batch["reset"] == (segment == 0)).all())
            source, target = batch["input"].numpy(), batch["target"].numpy()
            keep = target != IGNORE_INDEX
            counted += int(keep.sum())
            for row, start in enumerate(sampler.starts):
                if sampler.ends[row] > start:
                    inputs.setdefault(int(start), []).append(source[row][keep[row]])
                    targets.setdefault(int(start), []).append(target[row][keep[row]])
    assert counted == gutenberg.split_tokens("test") == len(data) - streams
    bounds = np.arange(streams + 1) * len(data) // streams
    assert sorted(targets) == bounds[:-1].tolist()
    for start, end in zip(bounds[:-1], bounds[1:], strict=True):
        assert np.array_equal(np.concatenate(targets[int(start)]), data[start + 1 : end])
        assert np.array_equal(np.concatenate(inputs[int(start)]), data[start : end - 1])


def test_datamodule_eval_loader_uses_whole_split(gutenberg: TextDataModule) -> None:
    loader = gutenberg.val_dataloader()
    targets = sum(int((batch["target"] != IGNORE_INDEX).sum()) for batch in loader)
    assert targets == gutenberg.split_tokens("validation") == len(gutenberg.split("validation")) - 8


# ----------------------------------------------------------------------------------------------- configs


def test_every_data_config_has_the_contract_keys(tmp_path: Path) -> None:
    configs = sorted(CONF.glob("*.yaml"))
    assert {path.stem for path in configs} >= {
        "enwik8", "text8", "pg19", "text_files", "gutenberg", "shakespeare", "kjv",
        "digits", "mnist", "fashion_mnist", "cifar10", "imagenet64",
    }  # fmt: skip
    for path in configs:
        cfg = data_preset(path.stem)  # with its defaults list (text: base/text.yaml)
        assert "defaults" not in cfg and cfg.kind in ("text", "image", "synthetic"), path
        assert all(isinstance(cfg[key], int) for key in ("vocab_size", "seq_len", "batch_size")), path
        if cfg.kind == "text":
            assert cfg.vocab_size == 256
        elif cfg.kind == "image":
            height, width, channels = cfg.image_shape
            assert cfg.seq_len == height * width * channels
        if cfg.kind != "synthetic":  # synthetic tasks are generated, never read from disk
            cfg.root = str(tmp_path / "absent")
        if path.stem in ("text_files", "hf"):
            cfg.corpus.path = "anything"
        module = instantiate(cfg)  # cheap: no file is touched
        assert isinstance(module, L.LightningDataModule), path
    assert data_preset("digits").vocab_size == 18


# ----------------------------------------------------------------------------------------------- Lightning


class _Recorder(L.LightningModule):
    """Minimal model that records the first byte of every row of every training batch."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.seen: list[list[int]] = []

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        self.seen.append(batch["input"][:, 0].tolist() + [int(batch["reset"][0])])
        return (self.weight - 1.0).pow(2).sum()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _trainer(
    tmp_path: Path, max_steps: int, callbacks: list[L.Callback], val_batches: float = 0
) -> L.Trainer:
    return L.Trainer(
        max_steps=max_steps,
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=val_batches,
        num_sanity_val_steps=0,
        default_root_dir=str(tmp_path),
        callbacks=callbacks,
    )


def test_lightning_resume_continues_the_stream(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    (tmp_path / "corpus.txt").write_bytes(rng.integers(32, 127, 60_000, dtype=np.uint8).tobytes())

    def module() -> TextDataModule:
        corpus = TextFilesCorpus("corpus.txt", split_by="bytes")
        return TextDataModule(corpus, seq_len=32, batch_size=4, sampler="stream", seed=1, root=str(tmp_path))

    total_steps = 12  # all inside the first pass: 4 streams of 13,492 bytes give 421 steps of 32
    reference = _Recorder()
    _trainer(tmp_path / "a", total_steps, []).fit(reference, datamodule=module())

    checkpoint = L.pytorch.callbacks.ModelCheckpoint(
        dirpath=tmp_path / "ckpt", every_n_train_steps=5, save_top_k=-1
    )
    first = _Recorder()
    _trainer(tmp_path / "b", 5, [checkpoint]).fit(first, datamodule=module())
    resumed = _Recorder()
    ckpt = next((tmp_path / "ckpt").glob("*step=5*.ckpt"))
    _trainer(tmp_path / "c", total_steps, []).fit(resumed, datamodule=module(), ckpt_path=str(ckpt))
    assert first.seen + resumed.seen == reference.seen
    assert reference.seen[0][-1] == 1 and all(row[-1] == 0 for row in reference.seen[1:])


class _TargetCounter(L.LightningModule):
    """Counts the non-ignored validation targets it is shown."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.targets = 0

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self.targets += int((batch["target"] != IGNORE_INDEX).sum())


def test_lightning_validate_sees_whole_split(data_dir: Path, tmp_path: Path) -> None:
    cfg = data_preset("shakespeare")
    cfg.seq_len, cfg.eval_batch_size = 512, 5
    module: TextDataModule = instantiate(cfg)
    counter = _TargetCounter()
    _trainer(tmp_path, 1, [], val_batches=1.0).validate(counter, datamodule=module, verbose=False)
    assert counter.targets == module.split_tokens("validation") == 111_540 - 5


def test_smoke_data_is_gutenberg_else_the_shipped_tiny_shakespeare(
    tmp_path: Path, data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The smoke preset trains on the Gutenberg books where the data root holds them, else (a fresh machine,
    no data root) on the tiny Shakespeare shipped in the package, saying so in one line; the shipped file is
    the published one, byte for byte."""
    assert hashlib.sha256(EMBEDDED.read_bytes()).hexdigest() == SHA256
    splits = {}
    for name, root in (("shipped", tmp_path), ("gutenberg", data_dir)):
        cfg = compose_config("train", ["experiment=smoke", f"data.root={root}", f"data.seq_len={SEQ_LEN}"])
        module = instantiate(cfg.data)
        module.prepare_data()
        module.setup("fit")
        splits[name] = module.splits
    said = [line for line in capsys.readouterr().out.splitlines() if "shipped in the package" in line]
    assert len(said) == 1 and str(tmp_path) in said[0]
    shakespeare = EMBEDDED.read_bytes()
    assert splits["shipped"]["train"].tobytes() + splits["shipped"]["validation"].tobytes() == shakespeare
    assert len(splits["gutenberg"]["train"]) > 10 * len(shakespeare)
    assert (CONF_ROOT / "experiment" / "smoke.yaml").read_text().count(
        "override /data: gutenberg_or_shipped"
    ) == 1
