"""CIFAR-10 / CIFAR-100 from the *binary version* of the datasets.

The widely used "python version" of CIFAR stores its batches as pickles; unpickling runs
arbitrary code from the file, so this module never does it. Use the binary version
(cifar-10-binary.tar.gz / cifar-100-binary.tar.gz from the CIFAR site), extracted:

- CIFAR-10: data_batch_1.bin .. data_batch_5.bin, test_batch.bin (and batches.meta.txt),
  each record = 1 label byte + 3072 pixel bytes (1024 red, 1024 green, 1024 blue, row-major 32x32).
- CIFAR-100: train.bin, test.bin (and coarse_label_names.txt, fine_label_names.txt),
  each record = 1 coarse label byte + 1 fine label byte + 3072 pixel bytes.
"""
from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from .base import ImageDataset
from .images import check_split, make_dataset, uint8_stats

PIXELS = 3 * 32 * 32
_SUBDIRS = {10: "cifar-10-batches-bin", 100: "cifar-100-binary"}
_FILES = {10: {"train": [f"data_batch_{i}.bin" for i in range(1, 6)], "test": ["test_batch.bin"]},
          100: {"train": ["train.bin"], "test": ["test.bin"]}}
_NAMES = {10: ["batches.meta.txt"], 100: ["fine_label_names.txt", "coarse_label_names.txt"]}


def _resolve_folder(folder, num_classes: int) -> Path:
    folder = Path(folder)
    first = _FILES[num_classes]["test"][0]
    for cand in (folder, folder / _SUBDIRS[num_classes]):
        if (cand / first).is_file():
            return cand
    files = ", ".join(_FILES[num_classes]["train"] + _FILES[num_classes]["test"])
    raise FileNotFoundError(f"CIFAR-{num_classes} binary files ({files}) not found in {folder} or "
                            f"{folder / _SUBDIRS[num_classes]}; note: only the binary version is supported "
                            "(the python version is pickled and is not loaded for safety)")


def read_cifar_bin(path, num_classes: int = 10):
    """One binary batch file -> (images uint8 (N, 3, 32, 32), coarse labels or None, labels)."""
    path = Path(path)
    n_label = 1 if num_classes == 10 else 2
    record = n_label + PIXELS
    raw = path.read_bytes()
    if len(raw) == 0 or len(raw) % record:
        raise ValueError(f"{path}: size {len(raw)} bytes is not a positive multiple of the CIFAR-{num_classes} "
                         f"record size {record} (corrupt or truncated file, or the wrong CIFAR variant)")
    arr = np.frombuffer(raw, dtype=np.uint8).reshape(-1, record)
    labels = arr[:, n_label - 1].astype(np.int64)
    coarse = arr[:, 0].astype(np.int64) if n_label == 2 else None
    if labels.max() >= num_classes or (coarse is not None and coarse.max() >= 20):
        raise ValueError(f"{path}: label byte out of range for CIFAR-{num_classes} (corrupt file?)")
    return arr[:, n_label:].reshape(-1, 3, 32, 32), coarse, labels


@functools.lru_cache(maxsize=4)
def _read_split(folder: str, num_classes: int, split: str, mtimes):
    parts = [read_cifar_bin(Path(folder) / f, num_classes) for f in _FILES[num_classes][split]]
    images = np.concatenate([p[0] for p in parts])
    coarse = np.concatenate([p[1] for p in parts]) if num_classes == 100 else None
    labels = np.concatenate([p[2] for p in parts])
    return images, coarse, labels


def _split(folder: Path, num_classes: int, split: str):
    paths = [folder / f for f in _FILES[num_classes][split]]
    missing = [p.name for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"CIFAR-{num_classes} {split} files missing in {folder}: {', '.join(missing)}")
    return _read_split(str(folder.resolve()), num_classes, split, tuple(p.stat().st_mtime_ns for p in paths))


def _class_names(folder: Path, num_classes: int, coarse: bool):
    name = _NAMES[num_classes][1 if coarse else 0]
    path = folder / name
    if not path.is_file():
        return None
    names = [line.strip() for line in path.read_text().splitlines() if line.strip()]
    return names or None


def load_cifar(folder, split: str = "train", num_classes: int = 10, label: str = "fine",
               normalize: bool = True) -> ImageDataset:
    """CIFAR-10 or CIFAR-100 from the binary version's files: (N, 3, 32, 32) float32.

    Reads only the binary format (see the module docstring); the pickled python version is
    deliberately not supported. `folder` is the extracted directory or its parent. For
    CIFAR-100, `label="fine"` (100 classes) or `"coarse"` (20 superclasses). Pixels are
    scaled to [0, 1] and standardised per channel with the training files' statistics.
    """
    check_split(split)
    if num_classes not in (10, 100):
        raise ValueError(f"num_classes must be 10 or 100, got {num_classes}")
    if label not in ("fine", "coarse"):
        raise ValueError(f"label must be 'fine' or 'coarse', got {label!r}")
    use_coarse = num_classes == 100 and label == "coarse"
    folder = _resolve_folder(folder, num_classes)
    images, coarse, labels = _split(folder, num_classes, split)
    stats = None
    if normalize:
        stats = uint8_stats(_split(folder, num_classes, "train")[0], per_channel=True)
    y = coarse if use_coarse else labels
    n_cls = 20 if use_coarse else num_classes
    name = f"cifar{num_classes}{'-coarse' if use_coarse else ''}-{split}"
    return make_dataset(images.astype(np.float32) / 255.0, y, n_cls, name,
                        _class_names(folder, num_classes, use_coarse), stats)


def load_cifar10(split: str = "train", folder=None, normalize: bool = True) -> ImageDataset:
    if folder is None:
        raise FileNotFoundError("load_cifar10 needs folder= (the extracted cifar-10-binary.tar.gz)")
    return load_cifar(folder, split, 10, normalize=normalize)


def load_cifar100(split: str = "train", folder=None, label: str = "fine", normalize: bool = True) -> ImageDataset:
    if folder is None:
        raise FileNotFoundError("load_cifar100 needs folder= (the extracted cifar-100-binary.tar.gz)")
    return load_cifar(folder, split, 100, label, normalize)
