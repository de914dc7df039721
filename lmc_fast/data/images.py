"""scikit-learn digits and MNIST / Fashion-MNIST from IDX files.

Images come back as (N, 1, H, W) float32 scaled to [0, 1] and then standardised with the
*training* split's mean and standard deviation (`normalize=False` keeps [0, 1]).
"""
from __future__ import annotations

import functools
import gzip
import os
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from .base import ImageDataset

FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"  # Debian package dataset-fashion-mnist
FASHION_MNIST_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                         "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot")
_IDX_NAMES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
              "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}


def check_split(split: str) -> str:
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    return split


def standardize(x: np.ndarray, mean, std):
    """(x - mean) / std with scalar or per-channel statistics, as float32."""
    mean = np.asarray(mean, dtype=np.float32).reshape(-1, 1, 1)
    std = np.asarray(std, dtype=np.float32).reshape(-1, 1, 1)
    return ((x - mean) / std).astype(np.float32)


def _stats(x: np.ndarray, per_channel: bool = False):
    """Mean and std of (N, C, H, W) data: one scalar each, or one per channel."""
    axes = (0, 2, 3) if per_channel else None
    mean = x.mean(axis=axes, dtype=np.float64)
    std = x.std(axis=axes, dtype=np.float64)
    return np.atleast_1d(mean).astype(np.float32), np.maximum(np.atleast_1d(std), 1e-8).astype(np.float32)


def uint8_stats(images: np.ndarray, per_channel: bool = False):
    """Exact mean/std of uint8 images (N, C, H, W) scaled by 1/255, via byte histograms (no float copy)."""
    chans = [images[:, c] for c in range(images.shape[1])] if per_channel else [images]
    means, stds = [], []
    for ch in chans:
        hist = np.bincount(np.ascontiguousarray(ch).reshape(-1), minlength=256).astype(np.float64)
        v = np.arange(256, dtype=np.float64) / 255.0
        n = hist.sum()
        m = (hist * v).sum() / n
        means.append(m)
        stds.append(np.sqrt(max((hist * (v - m) ** 2).sum() / n, 1e-16)))
    return np.asarray(means, dtype=np.float32), np.asarray(stds, dtype=np.float32)


def make_dataset(x: np.ndarray, y: np.ndarray, num_classes: int, name: str, classes=None,
                 stats=None) -> ImageDataset:
    """Wrap [0, 1]-scaled images; standardise with `stats=(mean, std)` when given."""
    mean = std = None
    if stats is not None:
        mean, std = stats
        x = standardize(x, mean, std)
        mean, std = [float(v) for v in mean], [float(v) for v in std]
    return ImageDataset(torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)),
                        torch.from_numpy(np.asarray(y, dtype=np.int64)), num_classes, name, classes, mean, std)


# --------------------------------------------------------------------------- digits
def load_digits(split: str = "train", test_fraction: float = 0.25, seed: int = 0,
                normalize: bool = True) -> ImageDataset:
    """scikit-learn's bundled 8x8 digits (1797 images, 10 classes): (N, 1, 8, 8) float32.

    The split is a deterministic stratified shuffle from `seed`; pixel values (0..16) are
    divided by 16 and standardised with the training split's mean and std.
    """
    from sklearn.datasets import load_digits as _sk_digits
    from sklearn.model_selection import train_test_split

    check_split(split)
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    d = _sk_digits()
    x = (d.images.astype(np.float32) / 16.0)[:, None]
    y = d.target.astype(np.int64)
    idx_train, idx_test = train_test_split(np.arange(len(y)), test_size=test_fraction, random_state=seed, stratify=y)
    idx_train.sort()
    idx_test.sort()
    stats = _stats(x[idx_train]) if normalize else None
    idx = idx_train if split == "train" else idx_test
    return make_dataset(x[idx], y[idx], 10, f"digits-{split}", [str(i) for i in range(10)], stats)


# --------------------------------------------------------------------------- IDX
def _find_file(folder: Path, base: str) -> Path:
    for name in (base, base + ".gz"):
        if (folder / name).is_file():
            return folder / name
    # some mirrors use a dot before idx ("train-images.idx3-ubyte")
    for name in (base.replace("-idx", ".idx"), base.replace("-idx", ".idx") + ".gz"):
        if (folder / name).is_file():
            return folder / name
    raise FileNotFoundError(f"{base}[.gz] not found in {folder}")


def read_idx(path) -> np.ndarray:
    """Read one IDX file (plain or gzip) into a uint8 array, validating header and size."""
    path = Path(path)
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as f:
                raw = f.read()
        else:
            raw = path.read_bytes()
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise ValueError(f"{path}: cannot read IDX file ({e})") from e
    if len(raw) < 4:
        raise ValueError(f"{path}: truncated IDX file ({len(raw)} bytes, no header)")
    zero, dtype_code, ndim = int.from_bytes(raw[:2], "big"), raw[2], raw[3]
    if zero != 0 or dtype_code != 0x08 or ndim not in (1, 3):
        raise ValueError(f"{path}: bad IDX magic number 0x{raw[:4].hex()} (expected 0x00000801 for labels "
                         "or 0x00000803 for images, unsigned bytes)")
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise ValueError(f"{path}: truncated IDX header")
    dims = [int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    expected = header + int(np.prod(dims))
    if len(raw) != expected:
        kind = "truncated" if len(raw) < expected else "oversized"
        raise ValueError(f"{path}: {kind} IDX file: header says {dims} ({expected} bytes), file has {len(raw)} bytes")
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(dims)


def _file_key(path: Path):
    st = path.stat()
    return str(path.resolve()), st.st_size, st.st_mtime_ns


@functools.lru_cache(maxsize=8)
def _read_idx_pair(images_key, labels_key):
    images, labels = read_idx(images_key[0]), read_idx(labels_key[0])
    if images.ndim != 3:
        raise ValueError(f"{images_key[0]}: expected an image file (3 dimensions), got {images.ndim}")
    if labels.ndim != 1:
        raise ValueError(f"{labels_key[0]}: expected a label file (1 dimension), got {labels.ndim}")
    if len(images) != len(labels):
        raise ValueError(f"{images_key[0]} has {len(images)} images but {labels_key[0]} has {len(labels)} labels")
    return images, labels


def _idx_split(folder: Path, split: str):
    img_name, lbl_name = _IDX_NAMES[split]
    img, lbl = _find_file(folder, img_name), _find_file(folder, lbl_name)
    return _read_idx_pair(_file_key(img), _file_key(lbl))


@functools.lru_cache(maxsize=8)
def _idx_train_stats(folder_key):
    images, _ = _idx_split(Path(folder_key), "train")
    return uint8_stats(images[:, None])


def load_idx(folder=None, split: str = "train", normalize: bool = True, name: str = "idx",
             classes=None, limit: Optional[int] = None) -> ImageDataset:
    """MNIST-format IDX files in `folder`: (N, 1, 28, 28) float32 and labels 0..9.

    Looks for train-images-idx3-ubyte / train-labels-idx1-ubyte (split="train") or
    t10k-images-idx3-ubyte / t10k-labels-idx1-ubyte (split="test"), plain or `.gz`.
    The default folder is where Debian's `dataset-fashion-mnist` installs Fashion-MNIST.
    Pixels are scaled to [0, 1] and standardised with the training file's statistics.
    `limit` keeps the first `limit` examples. A corrupt or truncated file raises ValueError
    naming the file.
    """
    check_split(split)
    if folder is None:
        folder = os.environ.get("LMC_FAST_FASHION_MNIST", FASHION_MNIST_DIR)
        hint = " (install it with `apt-get install dataset-fashion-mnist`, or pass folder=)"
    else:
        hint = ""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"IDX folder {folder} does not exist{hint}")
    try:
        images, labels = _idx_split(folder, split)
    except FileNotFoundError as e:
        raise FileNotFoundError(f"{e}{hint}") from None
    if limit is not None:
        images, labels = images[:limit], labels[:limit]
    stats = _idx_train_stats(str(folder.resolve())) if normalize else None
    num_classes = max(10, int(labels.max()) + 1) if len(labels) else 10
    x = images[:, None].astype(np.float32) / 255.0
    return make_dataset(x, labels, num_classes, f"{name}-{split}", classes, stats)


def load_fashion_mnist(split: str = "train", folder=None, normalize: bool = True,
                       limit: Optional[int] = None) -> ImageDataset:
    """Fashion-MNIST (default: the Debian `dataset-fashion-mnist` files) as (N, 1, 28, 28)."""
    return load_idx(folder, split, normalize, "fashion-mnist", FASHION_MNIST_CLASSES, limit)


def load_mnist(split: str = "train", folder=None, normalize: bool = True,
               limit: Optional[int] = None) -> ImageDataset:
    """MNIST from IDX files in `folder` (or $LMC_FAST_MNIST) as (N, 1, 28, 28)."""
    folder = folder or os.environ.get("LMC_FAST_MNIST")
    if folder is None:
        raise FileNotFoundError("load_mnist needs folder= (the IDX files; no copy ships with Debian/scikit-learn) "
                                "or $LMC_FAST_MNIST; Fashion-MNIST is available via `apt-get install dataset-fashion-mnist`")
    return load_idx(folder, split, normalize, "mnist", [str(i) for i in range(10)], limit)
