"""Image tokenisation, the real MNIST files, digits, and the ImageNet64 .npz reader."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision.datasets
from hydra.utils import instantiate

from tests.helpers.config import data_preset
from tvq_exp.data import ChecksumError, CorruptFileError, DataNotFoundError, ImageDataModule
from tvq_exp.data.download import digest_file
from tvq_exp.data.images import DigitsImages, IdxImages, Imagenet64Images, flatten_image, unflatten_tokens
from tvq_exp.data.samplers.images import ImageSampler


@pytest.mark.parametrize("shape", [(4, 5, 3), (28, 28, 1), (2, 3, 2)])
def test_flatten_unflatten_round_trip(shape: tuple[int, int, int]) -> None:
    image = torch.randint(0, 256, shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    tokens = flatten_image(image)
    assert tokens.shape == (shape[0] * shape[1] * shape[2],) and tokens.dtype == torch.int64
    assert torch.equal(unflatten_tokens(tokens, shape).to(torch.uint8), image)
    batch = torch.stack([tokens, tokens.flip(0)])
    assert unflatten_tokens(batch, shape).shape == (2, *shape)
    assert torch.equal(unflatten_tokens(batch, shape)[0], image.long())


def test_channels_are_interleaved_row_major() -> None:
    image = torch.zeros(2, 3, 3, dtype=torch.uint8)
    image[0, 0] = torch.tensor([10, 20, 30])
    image[0, 1] = torch.tensor([40, 50, 60])
    image[1, 0] = torch.tensor([70, 80, 90])
    tokens = flatten_image(image)
    assert tokens[:6].tolist() == [10, 20, 30, 40, 50, 60]
    assert tokens[9:12].tolist() == [70, 80, 90]
    with pytest.raises(ValueError, match="do not make an image"):
        unflatten_tokens(tokens[:-1], (2, 3, 3))


def test_mnist_from_shared_folder(data_dir: Path) -> None:
    module: ImageDataModule = instantiate(data_preset("mnist"))
    module.prepare_data()
    module.setup("fit")
    sizes = {split: len(module.dataset(split)) for split in ("train", "validation", "test")}
    assert sizes == {"train": 55_000, "validation": 5_000, "test": 10_000}
    assert module.image_shape == (28, 28, 1) and module.seq_len == 784 and module.bos_id == 256
    raw_dir = data_dir / "mnist" / "MNIST" / "raw"
    for name, md5 in torchvision.datasets.MNIST.resources:
        assert digest_file(raw_dir / name) == md5
    with gzip.open(raw_dir / "train-images-idx3-ubyte.gz", "rb") as handle:
        raw = handle.read()
    item = module.dataset("train")[0]
    assert item["target"].tolist() == list(raw[16 : 16 + 784])
    assert item["input"][0] == 256 and torch.equal(item["input"][1:], item["target"][:-1])
    held_out = module.dataset("validation")[0]["target"]
    assert held_out.tolist() == list(raw[16 + 55_000 * 784 : 16 + 55_001 * 784])
    batch = next(iter(module.val_dataloader()))
    assert (
        batch["input"].shape == (32, 784)
        and batch["reset"].dtype == torch.bool
        and bool(batch["reset"].all())
    )
    assert module.split_tokens("test") == 10_000 * 784


def test_corrupt_or_missing_mnist_is_refused(data_dir: Path, tmp_path: Path) -> None:
    raw_dir = tmp_path / "mnist" / "MNIST" / "raw"
    shutil.copytree(data_dir / "mnist" / "MNIST" / "raw", raw_dir)
    target = raw_dir / "t10k-images-idx3-ubyte.gz"
    data = bytearray(target.read_bytes())
    data[1000] ^= 0xFF
    target.write_bytes(bytes(data))
    with pytest.raises(
        ChecksumError, match=r"t10k-images-idx3-ubyte\.gz.*expected 9fb629c4189551a2d022fa330f9573f3"
    ):
        IdxImages("mnist").load(tmp_path)
    target.unlink()
    with pytest.raises(DataNotFoundError) as error:
        IdxImages("mnist").load(tmp_path)
    assert str(target) in str(error.value) and "download" in str(error.value)


def test_digits_levels_and_split() -> None:
    cfg = data_preset("digits")
    module: ImageDataModule = instantiate(cfg)
    module.setup("fit")
    assert module.vocab_size == 18 and module.bos_id == 17 and module.seq_len == 64
    assert [len(module.dataset(s)) for s in ("train", "validation", "test")] == [1437, 180, 180]
    train_targets = torch.stack(
        [module.dataset("train")[i]["target"] for i in range(len(module.dataset("train")))]
    )
    assert int(train_targets.max()) == 16 and int(train_targets.min()) == 0
    assert int(module.dataset("test")[0]["input"][0]) == 17
    again = instantiate(cfg)
    again.setup("fit")
    assert torch.equal(again.dataset("test")[5]["target"], module.dataset("test")[5]["target"])
    with pytest.raises(ValueError, match="vocab_size=.*must be levels \\+ 1 \\(BOS\\) = 18"):
        ImageDataModule(DigitsImages(), image_shape=[8, 8, 1], seq_len=64, vocab_size=257)
    with pytest.raises(ValueError, match="seq_len=.*must be H\\*W\\*C = 64"):
        ImageDataModule(DigitsImages(), image_shape=[8, 8, 1], seq_len=63, vocab_size=18)


def _planar_images(count: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (count, 64 * 64 * 3), dtype=np.uint8)


def test_imagenet64_npz_layout(tmp_path: Path) -> None:
    folder = tmp_path / "imagenet64"
    folder.mkdir()
    part1, part2, val = _planar_images(6, 1), _planar_images(4, 2), _planar_images(3, 3)
    np.savez(folder / "Imagenet64_train_part1.npz", data=part1, labels=np.arange(6))
    np.savez_compressed(folder / "Imagenet64_train_part2.npz", data=part2, labels=np.arange(4))
    np.savez(folder / "Imagenet64_val.npz", data=val, labels=np.arange(3))
    splits = Imagenet64Images(val_size=3).load(tmp_path)
    assert [len(splits[s]) for s in ("train", "validation", "test")] == [7, 3, 3]
    assert isinstance(splits["train"].parts[0], np.memmap), "stored npz members are memory-mapped"
    image = splits["validation"][0]  # training image 7 = part2[1]
    assert image.shape == (64, 64, 3)
    for y, x, c in ((0, 0, 0), (0, 1, 2), (5, 7, 1), (63, 63, 2)):
        assert image[y, x, c] == part2[1, c * 4096 + y * 64 + x]
    assert np.array_equal(splits["test"][2].transpose(2, 0, 1).reshape(-1), val[2])
    tokens = flatten_image(torch.from_numpy(splits["train"][0]))
    assert tokens[:3].tolist() == [part1[0, 0], part1[0, 4096], part1[0, 8192]]


def test_imagenet64_wrong_shape_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "imagenet64"
    folder.mkdir()
    np.savez(folder / "Imagenet64_train_part1.npz", data=_planar_images(5, 0)[:, :3072])
    np.savez(folder / "Imagenet64_train_part2.npz", data=_planar_images(5, 1))
    np.savez(folder / "Imagenet64_val.npz", data=_planar_images(2, 2))
    with pytest.raises(
        CorruptFileError, match=r"Imagenet64_train_part1\.npz.*\(5, 3072\).*expected \(N, 12288\)"
    ):
        Imagenet64Images(val_size=2).load(tmp_path)
    (folder / "Imagenet64_val.npz").unlink()
    with pytest.raises(DataNotFoundError, match="Imagenet64_val.npz"):
        Imagenet64Images(val_size=2).load(tmp_path)


def test_image_sampler_cuts_updates_and_resumes_mid_image() -> None:
    """Whole images in ``T / update_len`` updates (reset at the first, position = offset in the image); a
    sampler stopped mid-image and restored from its state continues with the same batches, into the next epoch."""
    images = [{"input": torch.arange(6) + 10 * i, "target": torch.arange(6) + 10 * i + 1} for i in range(5)]

    def sampler() -> ImageSampler:
        return ImageSampler(images, tokens=6, batch_size=2, seed=3, update_len=2)  # type: ignore[arg-type]

    whole = list(sampler())
    assert len(whole) == 2 * 3  # 5 images: 2 batches of 2 (one dropped), 3 updates each
    assert [bool(b["reset"][0]) for b in whole] == [True, False, False] * 2
    assert [int(b["position"][0]) for b in whole] == [0, 2, 4] * 2
    assert torch.equal(whole[1]["input"] % 10, torch.tensor([[2, 3], [2, 3]]))
    assert torch.equal(whole[1]["target"], whole[1]["input"] + 1)

    first = sampler()
    batches = iter(first)
    for _ in range(4):  # the middle of the second batch's image
        next(batches)
    resumed = sampler()
    resumed.load_state_dict(first.state_dict())
    rest = list(resumed)
    assert [torch.equal(a["input"], b["input"]) for a, b in zip(whole[4:], rest, strict=True)] == [True, True]
    next_epoch = list(resumed)
    assert len(next_epoch) == 6 and resumed.state_dict() == {"epoch": 1, "step": 6}

    def order(batches: list[dict[str, torch.Tensor]]) -> list[int]:
        return [int(row[0]) // 10 for batch in batches[::3] for row in batch["input"]]

    assert order(whole) == [4, 2, 1, 3] and order(next_epoch) == [1, 4, 0, 2]  # default_rng([seed, epoch])
