"""The base of the reference language models whose forward is the functional one (Llama, NeoX).

Such a model holds parameters under the standard names and answers `arch()`; its forward runs
lmc_fast/models/functional.py with K = 1, so it computes exactly what sweeps and matching compute.
"""
from __future__ import annotations

import torch
from torch import nn

from .blocks import Norm, init_weights


class PreNormBlock(nn.Module):
    """A pre-norm block's parameters under the standard names: ln1 and ln2 around the model's own
    attention and MLP modules."""

    def __init__(self, d: int, norm: str, eps: float, attn: nn.Module, mlp: nn.Module):
        super().__init__()
        self.ln1, self.ln2 = Norm(d, norm, eps), Norm(d, norm, eps)
        self.attn, self.mlp = attn, mlp


class FunctionalLanguageModel(nn.Module):
    """Subclasses set `self.config` (with `block_size`) and define `arch()`."""

    def _decoder(self, c, norm: str, attn, mlp) -> None:
        """The parameters of a pre-norm decoder: tok_embed, blocks (attn() and mlp() build each block's
        modules), ln_f, lm_head (tied to tok_embed when the config says so), GPT-2's init."""
        self.tok_embed = nn.Embedding(c.vocab_size, c.d_model)
        self.blocks = nn.ModuleList(PreNormBlock(c.d_model, norm, c.eps, attn(), mlp()) for _ in range(c.n_layer))
        self.ln_f = Norm(c.d_model, norm, c.eps)
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        init_weights(self)
        if c.tie_word_embeddings:
            self.lm_head.weight = self.tok_embed.weight

    def standard_params(self) -> dict[str, torch.Tensor]:
        """The parameters under their standard names (not detached), lm_head.weight included when tied."""
        return dict(self.named_parameters(remove_duplicate=False))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        block = self.config.block_size
        if ids.dim() != 2 or ids.shape[1] > block:
            raise ValueError(f"{type(self).__name__} expects token ids of shape (B, T<={block}), got {tuple(ids.shape)}")
        from . import functional as Fn  # here, not at import: functional imports vit.py (a cycle at load)

        params = {name: p.unsqueeze(0) for name, p in self.standard_params().items()}
        return Fn.forward(self.arch(), params, ids)[0]
