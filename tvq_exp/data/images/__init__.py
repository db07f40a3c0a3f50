"""Images as sub-pixel token sequences: the token layout, the sources on disk, the data module, drawing grids."""

from tvq_exp.data.images.module import ImageDataModule
from tvq_exp.data.images.sources import Cifar10Images, DigitsImages, IdxImages, Imagenet64Images, ImageSource
from tvq_exp.data.images.tokens import ImageArray, ImageTokenDataset, flatten_image, unflatten_tokens

__all__ = [
    "Cifar10Images",
    "DigitsImages",
    "IdxImages",
    "ImageArray",
    "ImageDataModule",
    "ImageSource",
    "ImageTokenDataset",
    "Imagenet64Images",
    "flatten_image",
    "unflatten_tokens",
]
