"""Batching and splitting for the in-memory datasets (no worker processes needed)."""
from __future__ import annotations

import math

import numpy as np
import torch


def _permutation(n: int, seed: int, epoch: int) -> torch.Tensor:
    # SeedSequence-based streams: (seed, epoch) pairs never collide the way seed + epoch would
    # (seed 0 epoch 1 vs seed 1 epoch 0), so two runs with different seeds never share an order.
    return torch.from_numpy(np.random.default_rng([int(seed), int(epoch)]).permutation(n))


class Loader:
    """A re-iterable source of `(inputs, targets)` torch batches over an indexable dataset.

    `dataset[index_tensor]` must return `(inputs, targets)` (as ImageDataset/TokenDataset do;
    for token blocks targets are the ids themselves). With `shuffle`, the order of epoch e
    depends only on (seed, e); each new `iter()` advances the epoch, and `set_epoch(e)`
    chooses it explicitly.
    """

    def __init__(self, dataset, batch_size: int, shuffle: bool = False, seed: int = 0, drop_last: bool = False):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.dataset = dataset
        self.batch_size = int(batch_size)
        self.shuffle = shuffle
        self.seed = int(seed)
        self.drop_last = drop_last
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        n = len(self.dataset)
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def order(self, epoch: int | None = None) -> torch.Tensor:
        """The example order of `epoch` (default: the next one to be iterated)."""
        n = len(self.dataset)
        if not self.shuffle:
            return torch.arange(n)
        return _permutation(n, self.seed, self.epoch if epoch is None else epoch)

    def __iter__(self):
        order = self.order()
        self.epoch += 1
        for b in range(len(self)):
            yield self.dataset[order[b * self.batch_size: (b + 1) * self.batch_size]]

    @property
    def num_examples(self) -> int:
        return len(self.dataset)

    def __repr__(self):
        return (f"Loader({getattr(self.dataset, 'name', type(self.dataset).__name__)!r}, batch_size={self.batch_size}, "
                f"shuffle={self.shuffle}, seed={self.seed}, batches={len(self)})")


def loader(dataset, batch_size: int = 128, shuffle: bool = False, seed: int = 0, drop_last: bool = False) -> Loader:
    """Batches `(inputs, targets)` from `dataset`; see `Loader`."""
    return Loader(dataset, batch_size, shuffle, seed, drop_last)


def split(dataset, fraction: float = 0.1, seed: int = 0):
    """Carve a random validation part out of `dataset`: returns (rest, validation).

    `fraction` of the examples (at least one) go to validation, chosen by `seed`; both parts
    keep the original order of their examples.
    """
    n = len(dataset)
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"fraction must be in (0, 1), got {fraction}")
    n_val = max(1, int(round(n * fraction)))
    if n_val >= n:
        raise ValueError(f"cannot split {n} examples with fraction {fraction}: nothing left to train on")
    perm = np.random.default_rng([int(seed), 0x5EED]).permutation(n)
    val_idx, rest_idx = np.sort(perm[:n_val]), np.sort(perm[n_val:])
    name = getattr(dataset, "name", "data")
    return dataset.subset(rest_idx, f"{name}-rest"), dataset.subset(val_idx, f"{name}-val")
