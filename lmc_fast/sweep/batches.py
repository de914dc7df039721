"""Helpers for the `data` argument: any iterable of (inputs, targets) batches."""
from __future__ import annotations

from collections.abc import Iterator

import torch


def reiterable(data):
    """Data that can be iterated more than once: one-shot iterators are materialised."""
    if data is None:
        raise ValueError("data is required: pass an iterable of (inputs, targets) batches")
    if isinstance(data, Iterator):
        data = list(data)
    return data


def limited(data, max_batches: int | None):
    for i, batch in enumerate(data):
        if max_batches is not None and i >= max_batches:
            return
        yield batch


class Checked:
    """`data` re-iterable, each batch checked (`checks.check_batch` against `spec`) as it is
    yielded: one line for a bad batch, as the sweeps give, before it reaches any computation."""

    def __init__(self, data, spec):
        self.data, self.spec = reiterable(data), spec

    def __iter__(self):
        from .checks import check_batch, check_images, check_token_ids

        for batch in self.data:
            if not isinstance(batch, (tuple, list)) or len(batch) != 2:
                raise ValueError(f"a batch must be an (inputs, targets) pair, got {type(batch).__name__}")
            if batch[1] is None and isinstance(batch[0], torch.Tensor):  # activation statistics read inputs only
                (check_token_ids if self.spec.inputs == "tokens" else check_images)(self.spec, batch[0])
            else:
                check_batch(self.spec, *batch)
            yield batch
