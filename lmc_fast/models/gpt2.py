"""Reference GPT-2 (pre-LN, learned positions, causal attention, tied embeddings)."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional

import torch
from torch import nn

from .blocks import Block, Norm, init_weights


@dataclass
class GPT2Config:
    n_layer: int = 2
    n_embd: int = 64
    n_head: int = 4
    vocab_size: int = 256
    block_size: int = 64
    d_mlp: Optional[int] = None  # default 4 * n_embd
    norm: str = "layernorm"
    eps: float = 1e-5
    activation: str = "gelu_tanh"  # GPT-2's "gelu_new"
    tie_word_embeddings: bool = True

    def __post_init__(self):
        if self.d_mlp is None:
            self.d_mlp = 4 * self.n_embd

    @classmethod
    def paper(cls, **overrides) -> "GPT2Config":
        """A small GPT-2 for character-level text: 6 layers, width 256, 8 heads, context 128."""
        base = dict(n_layer=6, n_embd=256, n_head=8, vocab_size=256, block_size=128)
        return cls(**{**base, **overrides})

    def to_dict(self) -> dict:
        return asdict(self)


class GPT2(nn.Module):
    def __init__(self, config: GPT2Config):
        super().__init__()
        c = self.config = config
        self.tok_embed = nn.Embedding(c.vocab_size, c.n_embd)
        self.pos_embed = nn.Parameter(torch.zeros(c.block_size, c.n_embd))
        self.blocks = nn.ModuleList(
            Block(c.n_embd, c.n_head, c.d_mlp, norm=c.norm, eps=c.eps, activation=c.activation, causal=True)
            for _ in range(c.n_layer)
        )
        self.ln_f = Norm(c.n_embd, c.norm, c.eps)
        self.lm_head = nn.Linear(c.n_embd, c.vocab_size, bias=False)
        init_weights(self)
        if c.tie_word_embeddings:
            self.lm_head.weight = self.tok_embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        c = self.config
        if ids.dim() != 2 or ids.shape[1] > c.block_size:
            raise ValueError(f"GPT2 expects token ids of shape (B, T<={c.block_size}), got {tuple(ids.shape)}")
        x = self.tok_embed(ids) + self.pos_embed[: ids.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))
