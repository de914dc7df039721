"""Helpers for the `data` argument: any iterable of (inputs, targets) batches."""
from __future__ import annotations

from collections.abc import Iterator


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
