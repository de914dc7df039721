"""The base of the reference language models whose forward is the functional one (Llama, NeoX).

Such a model holds parameters under the standard names and answers `arch()`; its forward runs
lmc_fast/models/functional.py with K = 1, so it computes exactly what sweeps and matching compute.
"""
from __future__ import annotations

import torch
from torch import nn


class FunctionalLanguageModel(nn.Module):
    """Subclasses set `self.config` (with `block_size`) and define `arch()`."""

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
