"""Reference GPT-2 (pre-LN, learned positions, causal attention, tied embeddings)."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional

import torch
from torch import nn

from .blocks import (ACTIVATIONS, NORMS, Block, Norm, block_param_count, init_weights, norm_param_count,
                     require_choice, require_eps, require_heads_divide, require_param_limit, require_positive_int)

SIZE_FIELDS = ("n_layer", "n_embd", "n_head", "vocab_size", "block_size")


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
    qkv_bias: bool = True  # False: q, k, v without biases (the canonical form keeps ln1's shift as a norm bias)
    tie_word_embeddings: bool = True

    def __post_init__(self):
        # everything checked before a GPT2 allocates a tensor: one line naming the field
        for name in SIZE_FIELDS:
            require_positive_int("GPT2Config", name, getattr(self, name))
        if self.d_mlp is None:
            self.d_mlp = 4 * self.n_embd
        require_positive_int("GPT2Config", "d_mlp", self.d_mlp)
        require_heads_divide("GPT2Config", "n_embd", self.n_embd, self.n_head)
        require_choice("GPT2Config", "norm", self.norm, NORMS)
        require_choice("GPT2Config", "activation", self.activation, ACTIVATIONS)
        require_eps("GPT2Config", self.eps)
        if not isinstance(self.qkv_bias, bool):
            raise ValueError(f"GPT2Config.qkv_bias must be true or false, got {self.qkv_bias!r}")
        require_param_limit("GPT2Config", self.param_count(),
                            f"n_layer={self.n_layer}, n_embd={self.n_embd}, d_mlp={self.d_mlp}, "
                            f"vocab_size={self.vocab_size}, block_size={self.block_size}")

    def param_count(self) -> int:
        """Exactly the parameters `GPT2(self)` allocates (a tied head counted once)."""
        d = self.n_embd
        embed = self.vocab_size * d + self.block_size * d
        head = norm_param_count(d, self.norm) + (0 if self.tie_word_embeddings else self.vocab_size * d)
        return embed + self.n_layer * block_param_count(d, self.d_mlp, self.norm, self.qkv_bias) + head

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
            Block(c.n_embd, c.n_head, c.d_mlp, norm=c.norm, eps=c.eps, activation=c.activation, causal=True,
                  qkv_bias=c.qkv_bias)
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
