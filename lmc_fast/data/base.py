"""The two dataset kinds: labelled images and fixed-length token blocks.

Both are plain holders of tensors with the metadata models need. Indexing with an int,
a slice or an index tensor returns `(inputs, targets)`; for token blocks the targets are
the ids themselves (the next-token shift happens inside the loss).
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from . import tokens


def _check_ids(name: str, what: str, ids: torch.Tensor, size: int, allow_ignore: bool) -> None:
    """ids in [0, size) (or -100, the ignore index, where allowed): one line naming a bad one."""
    kept = ids[ids != -100] if allow_ignore else ids
    if kept.numel():
        lo, hi = (int(v) for v in torch.aminmax(kept))
        if lo < 0 or hi >= size:
            raise ValueError(f"{name}: {what} {lo if lo < 0 else hi} is outside [0, {size})")


def _as_index(index):
    if isinstance(index, (list, tuple)):
        return torch.as_tensor(index, dtype=torch.long)
    return index


class ImageDataset:
    """Images `x` (N, C, H, W) float32 and integer labels `y` (N,) int64."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, num_classes: int, name: str = "images",
                 classes: Optional[Sequence[str]] = None, mean=None, std=None):
        if x.dim() != 4:
            raise ValueError(f"{name}: images must be (N, C, H, W), got {tuple(x.shape)}")
        if y.shape != x.shape[:1]:
            raise ValueError(f"{name}: {len(y)} labels for {len(x)} images")
        if int(num_classes) < 1:
            raise ValueError(f"{name}: num_classes must be >= 1, got {num_classes}")
        self.x = x.float()
        self.y = y.long()
        self.num_classes = int(num_classes)
        _check_ids(name, "label", self.y, self.num_classes, allow_ignore=True)
        self.name = name
        self.classes = list(classes) if classes is not None else None
        self.mean = mean  # the normalisation applied (None when raw), kept for reference
        self.std = std

    @property
    def image_shape(self) -> tuple:
        return tuple(self.x.shape[1:])

    @property
    def inputs(self) -> torch.Tensor:
        return self.x

    @property
    def targets(self) -> torch.Tensor:
        return self.y

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, index):
        index = _as_index(index)
        return self.x[index], self.y[index]

    def subset(self, indices, name: Optional[str] = None) -> "ImageDataset":
        idx = torch.as_tensor(indices, dtype=torch.long)
        return ImageDataset(self.x[idx], self.y[idx], self.num_classes, name or self.name, self.classes, self.mean, self.std)

    def __repr__(self):
        return f"ImageDataset({self.name!r}, n={len(self)}, image_shape={self.image_shape}, num_classes={self.num_classes})"


class TokenDataset:
    """Token blocks `ids` (N, block_size) int64; inputs and targets are both the ids."""

    def __init__(self, ids: torch.Tensor, vocab_size: int, name: str = "text", tokenizer: str = "byte",
                 chars: Optional[Sequence[str]] = None):
        if ids.dim() != 2:
            raise ValueError(f"{name}: token blocks must be (N, block_size), got {tuple(ids.shape)}")
        if int(vocab_size) < 1:
            raise ValueError(f"{name}: vocab_size must be >= 1, got {vocab_size}")
        self.ids = ids.long()
        self.vocab_size = int(vocab_size)
        _check_ids(name, "token id", self.ids, self.vocab_size, allow_ignore=False)
        self.name = name
        self.tokenizer = tokenizer
        self.chars = list(chars) if chars is not None else None
        self.num_classes = self.vocab_size

    @property
    def block_size(self) -> int:
        return self.ids.shape[1]

    @property
    def x(self) -> torch.Tensor:
        return self.ids

    @property
    def y(self) -> torch.Tensor:
        return self.ids

    inputs = x
    targets = y

    def __len__(self) -> int:
        return self.ids.shape[0]

    def __getitem__(self, index):
        ids = self.ids[_as_index(index)]
        return ids, ids

    def subset(self, indices, name: Optional[str] = None) -> "TokenDataset":
        idx = torch.as_tensor(indices, dtype=torch.long)
        return TokenDataset(self.ids[idx], self.vocab_size, name or self.name, self.tokenizer, self.chars)

    def encode(self, text: str) -> torch.Tensor:
        return tokens.encode(text, self.tokenizer, self.chars)

    def decode(self, ids) -> str:
        return tokens.decode(ids, self.tokenizer, self.chars)

    def __repr__(self):
        return (f"TokenDataset({self.name!r}, n={len(self)}, block_size={self.block_size}, "
                f"vocab_size={self.vocab_size}, tokenizer={self.tokenizer!r})")
