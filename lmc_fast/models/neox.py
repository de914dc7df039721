"""Reference GPT-NeoX (Pythia) model: LayerNorms with biases, parallel attention and MLP, rotary
positions on the first quarter of each head, biases on every linear layer, an untied head.

The modules only hold the parameters, under the standard names (lmc_fast/models/arch.py):
`tok_embed`, `blocks.L.{ln1, ln2, attn.q/k/v/o, mlp.fc1/fc2}`, `ln_f`, `lm_head`. The forward pass
is the library's one functional forward (lmc_fast/models/functional.py) run with K = 1, so this model,
Hugging Face's GPTNeoXForCausalLM and every sweep compute the same function.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass
from typing import Optional

from torch import nn

from .arch import Arch
from .blocks import require_choice, require_eps, require_param_limit, require_positive_int
from .functional_lm import FunctionalLanguageModel

SIZE_FIELDS = ("n_layer", "d_model", "n_head", "vocab_size", "block_size")
ACTIVATIONS = ("gelu", "gelu_tanh")


@dataclass
class NeoXConfig:
    n_layer: int = 2
    d_model: int = 64
    n_head: int = 4
    d_mlp: Optional[int] = None  # default 4 * d_model (Pythia's intermediate_size)
    vocab_size: int = 256
    block_size: int = 64  # longest input checked in forward (rotary positions need no table)
    rotary_pct: float = 0.25  # share of each head's dims with rotary positions (Pythia: 0.25)
    rope_theta: float = 10000.0
    eps: float = 1e-5
    activation: str = "gelu"
    parallel_residual: bool = True  # GPT-NeoX's use_parallel_residual
    tie_word_embeddings: bool = False

    def __post_init__(self):
        # everything checked before a NeoX allocates a tensor: one line naming the field
        for name in SIZE_FIELDS:
            require_positive_int("NeoXConfig", name, getattr(self, name))
        if self.d_mlp is None:
            self.d_mlp = 4 * self.d_model
        require_positive_int("NeoXConfig", "d_mlp", self.d_mlp)
        if self.d_model % self.n_head:
            raise ValueError(f"NeoXConfig.d_model={self.d_model} is not divisible by n_head={self.n_head}")
        pct = self.rotary_pct
        if isinstance(pct, bool) or not isinstance(pct, numbers.Real) or not 0 < pct <= 1:
            raise ValueError(f"NeoXConfig.rotary_pct must be a number in (0, 1], got {pct!r}")
        r = self.rotary_dim
        if r < 2 or r % 2:
            raise ValueError(f"NeoXConfig.rotary_pct={pct} gives {r} rotary dims of a {self.head_dim}-dim head: "
                             "must be even and at least 2")
        theta = self.rope_theta
        if isinstance(theta, bool) or not isinstance(theta, numbers.Real) or not (math.isfinite(theta) and theta > 1):
            raise ValueError(f"NeoXConfig.rope_theta must be a finite number > 1, got {theta!r}")
        require_eps("NeoXConfig", self.eps)
        require_choice("NeoXConfig", "activation", self.activation, ACTIVATIONS)
        for name in ("parallel_residual", "tie_word_embeddings"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"NeoXConfig.{name} must be true or false, got {getattr(self, name)!r}")
        require_param_limit("NeoXConfig", self.param_count(),
                            f"n_layer={self.n_layer}, d_model={self.d_model}, d_mlp={self.d_mlp}, "
                            f"vocab_size={self.vocab_size}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    @property
    def rotary_dim(self) -> int:
        """Hugging Face's rotary_ndims: int(head_dim * rotary_pct)."""
        return int(self.head_dim * self.rotary_pct)

    def param_count(self) -> int:
        """Exactly the parameters `NeoX(self)` allocates (a tied head counted once)."""
        d, f = self.d_model, self.d_mlp
        block = 4 * d * d + 4 * d + d * f + f + f * d + d + 4 * d
        head = 2 * d + (0 if self.tie_word_embeddings else self.vocab_size * d)
        return self.vocab_size * d + self.n_layer * block + head

    def to_dict(self) -> dict:
        return asdict(self)


class NeoXAttention(nn.Module):
    """Parameters only: q, k, v and o with biases (Hugging Face fuses q, k and v per head)."""

    def __init__(self, c: NeoXConfig):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(c.d_model, c.d_model) for _ in range(4))


class NeoXMLP(nn.Module):
    def __init__(self, c: NeoXConfig):
        super().__init__()
        self.fc1 = nn.Linear(c.d_model, c.d_mlp)
        self.fc2 = nn.Linear(c.d_mlp, c.d_model)


class NeoX(FunctionalLanguageModel):
    def __init__(self, config: NeoXConfig):
        super().__init__()
        c = self.config = config
        self._decoder(c, "layernorm", lambda: NeoXAttention(c), lambda: NeoXMLP(c))

    def arch(self) -> Arch:
        c = self.config
        return Arch.neox(c.n_layer, c.d_model, c.n_head, c.d_mlp, eps=float(c.eps), activation=c.activation,
                         rope_theta=float(c.rope_theta), rotary_dim=c.rotary_dim,
                         residual="parallel" if c.parallel_residual else "sequential")
