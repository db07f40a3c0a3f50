"""Image datasets on disk: scikit-learn's digits, MNIST-style IDX files, CIFAR-10 batches, ImageNet64 ``.npz``.

Each source's ``load(root)`` returns ``{"train", "validation", "test"}`` ->
:class:`~tvq_exp.data.images.tokens.ImageArray` (see :mod:`tvq_exp.data.images.tokens` for the token layout).
"""

from __future__ import annotations

import gzip
import math
import pickle
import zipfile
import zlib
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from tvq_exp.data.download import verify_file
from tvq_exp.data.images.tokens import ImageArray
from tvq_exp.data.paths import CorruptFileError, not_found, resolve

IDX_IMAGES_MAGIC = 0x803


class ImageSource(ABC):
    """An image dataset: ``shape`` ``(H, W, C)``, ``levels`` pixel values, splits from ``load(root)``."""

    name: str = "images"
    shape: tuple[int, int, int] = (0, 0, 0)
    levels: int = 256

    def prepare(self, root: Path) -> None:  # noqa: B027 (optional hook, not abstract)
        """Fetch missing files; the default has nothing to fetch."""

    @abstractmethod
    def load(self, root: Path) -> dict[str, ImageArray]:
        """Read the three splits."""


class DigitsImages(ImageSource):
    """scikit-learn's 8x8 ``digits`` (1797 images, values 0..16: 17 levels; ships with scikit-learn).

    Fixed split from a permutation seeded by ``seed``: the first ``test_size`` images -> test, the next
    ``val_size`` -> validation, the remaining 1437 (defaults) -> train.
    """

    name = "digits"
    shape = (8, 8, 1)
    levels = 17

    def __init__(self, seed: int = 0, val_size: int = 180, test_size: int = 180) -> None:
        self.seed = seed
        self.val_size = val_size
        self.test_size = test_size

    def load(self, root: Path) -> dict[str, ImageArray]:
        from sklearn.datasets import load_digits

        images = load_digits().images.astype(np.uint8)[..., None]
        order = np.random.default_rng(self.seed).permutation(len(images))
        test, val = self.test_size, self.test_size + self.val_size
        return {
            "train": ImageArray((images[order[val:]],)),
            "validation": ImageArray((images[order[test:val]],)),
            "test": ImageArray((images[order[:test]],)),
        }


class IdxImages(ImageSource):
    """MNIST or Fashion-MNIST from torchvision's layout ``<root>/<name>/<Class>/raw/*-idx3-ubyte.gz``.

    The ``.gz`` files are read directly (gzip + numpy) after checking their md5 against torchvision's
    ``resources`` list. Validation = the last ``val_size`` (5000) training images; test = the official
    10,000 test images. ``download: true`` lets torchvision fetch missing files in ``prepare``.
    """

    shape = (28, 28, 1)
    levels = 256
    CLASSES = {"mnist": "MNIST", "fashion_mnist": "FashionMNIST"}

    def __init__(self, name: str = "mnist", val_size: int = 5000, download: bool = False) -> None:
        if name not in self.CLASSES:
            raise ValueError(f"name must be one of {sorted(self.CLASSES)}, got {name!r}")
        self.name = name
        self.val_size = val_size
        self.download = download

    def raw_dir(self, root: Path) -> Path:
        """The folder holding the ``.gz`` files."""
        return root / self.name / self.CLASSES[self.name] / "raw"

    def resources(self) -> dict[str, str]:
        """File name -> md5, from torchvision."""
        import torchvision.datasets

        return dict(getattr(torchvision.datasets, self.CLASSES[self.name]).resources)

    def prepare(self, root: Path) -> None:
        if self.download and any(not (self.raw_dir(root) / name).is_file() for name in self.resources()):
            import torchvision.datasets

            getattr(torchvision.datasets, self.CLASSES[self.name])(root=str(root / self.name), download=True)

    def load(self, root: Path) -> dict[str, ImageArray]:
        resources = self.resources()
        train = ImageArray((self._images(root, "train-images-idx3-ubyte.gz", resources),))
        test = ImageArray((self._images(root, "t10k-images-idx3-ubyte.gz", resources),))
        train, validation = train.split_tail(self.val_size)
        return {"train": train, "validation": validation, "test": test}

    def _images(self, root: Path, file_name: str, resources: dict[str, str]) -> np.ndarray:
        """Checked images of one IDX file, ``(N, 28, 28, 1)`` uint8."""
        path = self.raw_dir(root) / file_name
        if not path.is_file():
            fix = "copy the torchvision files there, or set data.source.download=true"
            raise not_found(f"{self.name} file {file_name}", [path], fix, root)
        verify_file(path, md5=resources[file_name])
        try:
            with gzip.open(path, "rb") as handle:
                raw = handle.read()
        except (EOFError, zlib.error, gzip.BadGzipFile) as error:
            raise CorruptFileError(f"{path} is truncated or corrupt ({error})") from error
        return parse_idx_images(raw, path)[..., None]


def parse_idx_images(raw: bytes, path: Path) -> np.ndarray:
    """IDX image bytes (magic 0x803, big-endian count/rows/cols header) -> ``(N, rows, cols)`` uint8."""
    if len(raw) < 16:
        raise CorruptFileError(f"{path}: too short for an IDX header ({len(raw)} bytes)")
    magic, count, rows, cols = np.frombuffer(raw[:16], dtype=">i4")
    if magic != IDX_IMAGES_MAGIC or len(raw) != 16 + int(count) * rows * cols:
        raise CorruptFileError(
            f"{path}: not an IDX image file (magic {magic:#x}, {count}x{rows}x{cols} header, {len(raw)} bytes)"
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=16).reshape(int(count), int(rows), int(cols))


class Cifar10Images(ImageSource):
    """CIFAR-10 python batches under ``<root>/cifar10/cifar-10-batches-py/`` (md5s from torchvision).

    Validation = the last ``val_size`` (5000) of the 50,000 training images; test = ``test_batch``.
    """

    name = "cifar10"
    shape = (32, 32, 3)
    levels = 256

    def __init__(self, val_size: int = 5000, download: bool = False) -> None:
        self.val_size = val_size
        self.download = download

    @staticmethod
    def batches() -> tuple[list[list[str]], list[list[str]]]:
        """``(train_list, test_list)`` of ``[file name, md5]`` from torchvision."""
        import torchvision.datasets

        return torchvision.datasets.CIFAR10.train_list, torchvision.datasets.CIFAR10.test_list

    def folder(self, root: Path) -> Path:
        """The ``cifar-10-batches-py`` folder."""
        return root / "cifar10" / "cifar-10-batches-py"

    def prepare(self, root: Path) -> None:
        train_list, test_list = self.batches()
        if self.download and any(
            not (self.folder(root) / name).is_file() for name, _ in train_list + test_list
        ):
            import torchvision.datasets

            torchvision.datasets.CIFAR10(root=str(root / "cifar10"), download=True)

    def load(self, root: Path) -> dict[str, ImageArray]:
        train_list, test_list = self.batches()
        train = ImageArray(tuple(self._batch(root, name, md5) for name, md5 in train_list))
        train, validation = train.split_tail(self.val_size)
        test = ImageArray(tuple(self._batch(root, name, md5) for name, md5 in test_list))
        return {"train": train, "validation": validation, "test": test}

    def _batch(self, root: Path, name: str, md5: str) -> np.ndarray:
        """One md5-checked pickle batch as ``(10000, 32, 32, 3)`` uint8."""
        path = self.folder(root) / name
        if not path.is_file():
            fix = "extract cifar-10-python.tar.gz there, or set data.source.download=true"
            raise not_found(f"CIFAR-10 batch {name}", [path], fix, root)
        verify_file(path, md5=md5)
        with open(path, "rb") as handle:
            data = np.asarray(pickle.load(handle, encoding="latin1")["data"], dtype=np.uint8)
        return np.ascontiguousarray(data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))


class Imagenet64Images(ImageSource):
    """Downsampled ImageNet 64x64 ``.npz`` files under ``<root>/imagenet64/``.

    Each file has key ``data`` of shape ``(N, 12288)`` uint8 in planar order (all R, then G, then B, each
    64x64 row-major); items are converted to ``(64, 64, 3)``. Stored (uncompressed) members are
    memory-mapped. As in the official Transformer-VQ code, validation = the training images after the first
    1,200,000, i.e. the last ``val_size = 81167`` of the 1,281,167; test = the official validation set.
    """

    name = "imagenet64"
    shape = (64, 64, 3)
    levels = 256

    def __init__(
        self,
        train_files: Sequence[str] = ("Imagenet64_train_part1.npz", "Imagenet64_train_part2.npz"),
        test_files: Sequence[str] = ("Imagenet64_val.npz",),
        val_size: int = 81167,
        path: str = "imagenet64",
    ) -> None:
        self.train_files = tuple(train_files)
        self.test_files = tuple(test_files)
        self.val_size = val_size
        self.path = path

    def load(self, root: Path) -> dict[str, ImageArray]:
        folder = resolve(self.path, root)
        paths = [folder / name for name in self.train_files + self.test_files]
        missing = [path for path in paths if not path.is_file()]
        if missing:
            raise not_found(
                "ImageNet64 .npz files", missing, "put the downsampled ImageNet 64x64 .npz files there", root
            )
        train = ImageArray(
            tuple(read_npz_images(folder / name, self.shape) for name in self.train_files), planar=True
        )
        test = ImageArray(
            tuple(read_npz_images(folder / name, self.shape) for name in self.test_files), planar=True
        )
        train, validation = train.split_tail(self.val_size)
        return {"train": train, "validation": validation, "test": test}


def read_npz_images(path: Path, shape: tuple[int, int, int], key: str = "data") -> np.ndarray:
    """``key`` of an ``.npz`` as planar ``(N, C, H, W)`` uint8 (memory-mapped when stored uncompressed).

    Refuses (with :class:`CorruptFileError` naming the file) anything that is not ``(N, H*W*C)`` uint8.
    """
    height, width, channels = shape
    try:
        array = _npz_member(path, key)
    except (zipfile.BadZipFile, ValueError, EOFError, zlib.error, KeyError) as error:
        raise CorruptFileError(f"{path}: cannot read array {key!r} ({error})") from error
    if array.ndim != 2 or array.shape[1] != math.prod(shape) or array.dtype != np.uint8:
        raise CorruptFileError(
            f"{path}: {key!r} has shape {array.shape} and dtype {array.dtype}, expected (N, {math.prod(shape)}) uint8 "
            f"(N images of {height}x{width}x{channels} in planar order); replace it with the right file or point "
            "the data config at the dataset it belongs to"
        )
    return array.reshape(len(array), channels, height, width)


def _npz_member(path: Path, key: str) -> np.ndarray:
    """Memory-map ``key.npy`` inside the zip when stored uncompressed (npy format 1.0/2.0), else load it."""
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo(f"{key}.npy")
        header = _stored_npy_header(path, info) if info.compress_type == zipfile.ZIP_STORED else None
        if header is None:
            with archive.open(info) as member:
                return np.lib.format.read_array(member, allow_pickle=False)
    array_shape, dtype, offset = header
    return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=array_shape)


def _stored_npy_header(path: Path, info: zipfile.ZipInfo) -> tuple[tuple[int, ...], np.dtype, int] | None:
    """``(shape, dtype, data offset in the zip file)`` of a stored C-ordered ``.npy`` member, else ``None``."""
    readers = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
    with open(path, "rb") as handle:
        handle.seek(info.header_offset)
        local_header = handle.read(30)
        name_len = int.from_bytes(local_header[26:28], "little")
        extra_len = int.from_bytes(local_header[28:30], "little")
        handle.seek(info.header_offset + 30 + name_len + extra_len)
        version = np.lib.format.read_magic(handle)
        if version not in readers:
            return None
        array_shape, fortran, dtype = readers[version](handle)
        offset = handle.tell()
    if fortran or dtype.hasobject or 0 in array_shape:
        return None
    return array_shape, dtype, offset
