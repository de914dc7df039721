"""Tiny-ImageNet from its standard extracted folder layout, decoded with PIL.

    <folder>/wnids.txt                      one WordNet id per line (defines class order)
    <folder>/words.txt                      optional "wnid<TAB>names" lines
    <folder>/train/<wnid>/images/*.JPEG
    <folder>/val/images/*.JPEG
    <folder>/val/val_annotations.txt        "file<TAB>wnid<TAB>x0<TAB>y0<TAB>x1<TAB>y1"

The official test split has no labels, so split="test" means the labelled val split.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np

from .base import ImageDataset
from .images import make_dataset

# ImageNet channel statistics (Tiny-ImageNet is an ImageNet subset; computing its own
# statistics would mean decoding all 100k training images for every val load).
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
_EXTS = {".jpeg", ".jpg", ".png"}


def _read_image(path: Path, size: int) -> np.ndarray:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as im:
            im = im.convert("RGB")
            if im.size != (size, size):
                im = im.resize((size, size), Image.BILINEAR)
            return np.asarray(im, dtype=np.uint8).transpose(2, 0, 1)
    except (UnidentifiedImageError, OSError) as e:
        raise ValueError(f"{path}: cannot decode image ({e})") from e


def _images_in(folder: Path):
    return sorted(p for p in folder.iterdir() if p.suffix.lower() in _EXTS)


def load_tiny_imagenet(folder, split: str = "train", image_size: int = 64, normalize: bool = True,
                       limit_per_class: Optional[int] = None) -> ImageDataset:
    """Tiny-ImageNet (200 classes) as (N, 3, image_size, image_size) float32.

    split: "train" or "val" ("test" is accepted as an alias of "val", the labelled split).
    Classes follow the order of wnids.txt. Files are read in sorted order, so the result is
    deterministic. `limit_per_class` keeps the first k images of each class (handy on CPU).
    Standardised with the ImageNet channel mean/std unless normalize=False.
    """
    if split not in ("train", "val", "test"):
        raise ValueError(f"split must be 'train', 'val' or 'test' (alias of val), got {split!r}")
    split = "val" if split == "test" else split
    folder = Path(folder)
    wnids_file = folder / "wnids.txt"
    if not wnids_file.is_file():
        raise FileNotFoundError(f"{wnids_file} not found: expected the extracted tiny-imagenet-200 folder")
    wnids = [w.strip() for w in wnids_file.read_text().splitlines() if w.strip()]
    index = {w: i for i, w in enumerate(wnids)}

    items: list[tuple[Path, int]] = []
    if split == "train":
        for w in wnids:
            d = folder / "train" / w / "images"
            if not d.is_dir():
                raise FileNotFoundError(f"{d} not found (class {w} listed in wnids.txt)")
            files = _images_in(d)
            items += [(p, index[w]) for p in (files[:limit_per_class] if limit_per_class else files)]
    else:
        ann = folder / "val" / "val_annotations.txt"
        if not ann.is_file():
            raise FileNotFoundError(f"{ann} not found")
        counts: dict[int, int] = {}
        for n, line in enumerate(ann.read_text().splitlines(), 1):
            if not line.strip():
                continue
            fields = line.split("\t")
            if len(fields) < 2 or fields[1] not in index:
                raise ValueError(f"{ann}:{n}: expected 'file<TAB>wnid...' with a wnid from wnids.txt, got {line!r}")
            label = index[fields[1]]
            if limit_per_class and counts.get(label, 0) >= limit_per_class:
                continue
            counts[label] = counts.get(label, 0) + 1
            items.append((folder / "val" / "images" / fields[0], label))
        items.sort(key=lambda t: t[0].name)
    if not items:
        raise ValueError(f"no {split} images found under {folder}")

    x = np.empty((len(items), 3, image_size, image_size), dtype=np.uint8)
    for i, (p, _) in enumerate(items):
        if not p.is_file():
            raise FileNotFoundError(f"{p} listed but missing")
        x[i] = _read_image(p, image_size)
    y = np.array([label for _, label in items], dtype=np.int64)
    classes = _class_names(folder, wnids)
    stats = (np.array(IMAGENET_MEAN, np.float32), np.array(IMAGENET_STD, np.float32)) if normalize else None
    return make_dataset(x.astype(np.float32) / 255.0, y, len(wnids), f"tiny-imagenet-{split}", classes, stats)


def _class_names(folder: Path, wnids):
    words = folder / "words.txt"
    if not words.is_file():
        return list(wnids)
    names = {}
    for line in words.read_text(errors="replace").splitlines():
        w, _, rest = line.partition("\t")
        names[w.strip()] = rest.strip()
    return [names.get(w) or w for w in wnids]
