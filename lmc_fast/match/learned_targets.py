"""The end-model target of learned matching (target="endpoints"): at mixing weights w, the mixture
sum_n w_n softmax(z_n / T) of the end models' predictive distributions, scored by soft cross-entropy.

The end models never change during the loop, so their distributions on a training batch are the same
every time the batch comes back: `EndpointTargets` keeps them per batch (up to a byte budget) and
each later pass over the training batches skips the end models' forward, a quarter of a step's
work with two lambdas a step. Only fixed batches are kept (a list of tensors, not augmented): a
batch object that changes between passes is computed afresh, so a kept target is always the one
the forward would give (the same function on the same tensor).
"""
from __future__ import annotations

import torch

from ..models import functional as Fn

#: Bytes of end-model distributions kept across passes over the training batches; batches past the
#: budget are computed every time (a large vocabulary fills it with a few batches, or with none).
CACHE_BYTES = 1 << 30


def soft_cross_entropy(logits: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    """Mean over examples (and tokens) of -sum_c p_c log softmax(z)_c."""
    return -(probs * torch.log_softmax(logits.float(), -1)).sum(-1).mean()


def endpoint_probs(arch, stacked_ends, x, temperature: float = 1.0) -> torch.Tensor:
    """(N, B, ..., C) the end models' predictive distributions on x (softmax of logits / T), no gradient."""
    with torch.no_grad():
        return torch.softmax(Fn.forward(arch, stacked_ends, x).float() / temperature, -1)


def mixed_endpoint_probs(arch, stacked_ends, w, x, temperature: float = 1.0) -> torch.Tensor:
    """(K, ...) mixtures w @ p_n of the end models' predictive distributions on x, no gradient."""
    return mix(w, endpoint_probs(arch, stacked_ends, x, temperature))


def mix(w: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return torch.einsum("kn,n...->k...", w.float(), probs)


class EndpointTargets:
    """The end models' distributions per training batch, kept for the next pass over the batches.

    `mixed(index, batch, x, w)`: the target for the `index`-th batch of a pass, whose original
    tensor (before any move to the device) is `batch`, evaluated at inputs x. Kept only when
    `keep` (fixed batches, no augmentation), while the budget lasts, and reused only for the very
    same tensor object at that index."""

    def __init__(self, arch, stacked_ends, temperature: float, keep: bool, budget: int | None = None):
        self.arch, self.ends, self.temperature, self.keep = arch, stacked_ends, temperature, keep
        self.budget = CACHE_BYTES if budget is None else budget
        self.kept: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.used = 0
        self.hits = 0

    def mixed(self, index: int, batch: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        entry = self.kept.get(index)
        if entry is not None and entry[0] is batch:
            self.hits += 1
            return mix(w, entry[1])
        probs = endpoint_probs(self.arch, self.ends, x, self.temperature)
        size = probs.numel() * probs.element_size()
        if self.keep and entry is None and self.used + size <= self.budget:
            self.kept[index] = (batch, probs)
            self.used += size
        return mix(w, probs)
