"""Masked-token data for BERT-style models: token blocks with a fixed masking.

BERT's recipe: 15% of the positions are chosen; of those, 80% become the [MASK] id, 10% a random
token, 10% stay; the targets are the original ids there and -100 (ignored) everywhere else, as
Hugging Face's masked-LM collator gives them. The masking is drawn once per block from a seed
(static masking, as BERT's original data pipeline did), so every evaluation of a model sees the
same masked batches and a barrier is deterministic. The [MASK] id is the text's vocabulary size:
a model of vocab_size + 1 ids reads these blocks.
"""
from __future__ import annotations

import torch

from .base import TokenDataset

MASK_RATE = 0.15


class MaskedTokenDataset(TokenDataset):
    """Blocks of `base` (a TokenDataset) with inputs masked and targets at the masked positions."""

    def __init__(self, base: TokenDataset, rate: float = MASK_RATE, seed: int = 0):
        if not isinstance(base, TokenDataset):
            raise ValueError(f"masked-token data needs token blocks, got {type(base).__name__}")
        if isinstance(base, MaskedTokenDataset):
            raise ValueError(f"{base.name} is masked already")
        if not 0.0 < float(rate) < 1.0:
            raise ValueError(f"mask rate must be in (0, 1), got {rate!r}")
        super().__init__(base.ids, base.vocab_size + 1, f"{base.name}-masked", base.tokenizer, base.chars)
        self.base, self.rate, self.seed = base, float(rate), int(seed)
        self.mask_id = base.vocab_size
        self.masked, self.labels = mask_tokens(base.ids, base.vocab_size, self.rate, self.seed)

    @property
    def x(self) -> torch.Tensor:
        return self.masked

    @property
    def y(self) -> torch.Tensor:
        return self.labels

    inputs = x
    targets = y

    def __getitem__(self, index):
        from .base import _as_index

        i = _as_index(index)
        return self.masked[i], self.labels[i]

    def subset(self, indices, name=None) -> "MaskedTokenDataset":
        """The same blocks with the same masking (drawn for the whole set, not redrawn)."""
        idx = torch.as_tensor(indices, dtype=torch.long)
        out = MaskedTokenDataset.__new__(MaskedTokenDataset)
        TokenDataset.__init__(out, self.ids[idx], self.vocab_size, name or self.name, self.tokenizer, self.chars)
        out.base, out.rate, out.seed, out.mask_id = self.base, self.rate, self.seed, self.mask_id
        out.masked, out.labels = self.masked[idx], self.labels[idx]
        return out

    def __repr__(self):
        return (f"MaskedTokenDataset({self.name!r}, n={len(self)}, block_size={self.block_size}, "
                f"vocab_size={self.vocab_size}, mask_id={self.mask_id}, rate={self.rate})")


def mask_tokens(ids: torch.Tensor, vocab: int, rate: float = MASK_RATE, seed: int = 0):
    """(masked inputs, targets) of (N, T) ids: BERT's 80/10/10 rule on `rate` of the positions,
    at least one position a block; targets -100 where nothing was chosen."""
    gen = torch.Generator().manual_seed(int(seed))
    chosen = torch.rand(ids.shape, generator=gen) < rate
    first = torch.randint(0, ids.shape[1], (ids.shape[0],), generator=gen)
    chosen[torch.arange(ids.shape[0]), first] |= ~chosen.any(1)  # every block teaches something
    roll = torch.rand(ids.shape, generator=gen)
    random_ids = torch.randint(0, vocab, ids.shape, generator=gen)
    masked = ids.clone()
    masked[chosen & (roll < 0.8)] = vocab  # [MASK]
    swap = chosen & (roll >= 0.8) & (roll < 0.9)
    masked[swap] = random_ids[swap]
    labels = torch.where(chosen, ids, torch.full_like(ids, -100))
    return masked, labels


def for_task(dataset, task: str):
    """The data a model of `task` reads: token blocks masked for "masked_token" models (once; masked data
    passes as it is), anything else unchanged."""
    if task == "masked_token" and isinstance(dataset, TokenDataset) and not isinstance(dataset, MaskedTokenDataset):
        return MaskedTokenDataset(dataset)
    return dataset
