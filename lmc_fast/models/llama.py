"""Reference LLaMA-family model: RMSNorm, rotary positions, grouped-query attention, SwiGLU MLP.

The modules only hold the parameters, under the standard names (lmc_fast/models/arch.py):
`tok_embed`, `blocks.L.{ln1, ln2, attn.q/k/v/o, mlp.gate/fc1/fc2}`, `ln_f`, `lm_head`. The forward
pass is the library's one functional forward (lmc_fast/models/functional.py) run with K = 1, so the
reference model, Hugging Face's Llama / Mistral / Qwen2 and every sweep compute the same function.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass
from typing import Optional

from torch import nn

from .arch import Arch
from .blocks import require_eps, require_param_limit, require_positive_int
from .functional_lm import FunctionalLanguageModel

SIZE_FIELDS = ("n_layer", "d_model", "n_head", "n_kv_head", "vocab_size", "block_size")


def swiglu_width(d_model: int) -> int:
    """LLaMA's MLP width for a width-d model: about 8/3 d (two thirds of 4d), rounded up to a multiple of 4."""
    return 4 * math.ceil(2 * d_model / 3)


@dataclass
class LlamaConfig:
    n_layer: int = 2
    d_model: int = 64
    n_head: int = 4
    n_kv_head: int = 2  # key / value heads (grouped-query attention); n_head for plain multi-head
    d_mlp: Optional[int] = None  # default swiglu_width(d_model): 172 for d_model 64
    vocab_size: int = 256
    block_size: int = 64  # longest input checked in forward (rotary positions need no table)
    head_dim: Optional[int] = None  # default d_model // n_head
    rope_theta: float = 10000.0
    eps: float = 1e-6
    tie_word_embeddings: bool = False
    qkv_bias: bool = False  # Qwen2-style biases on q, k and v

    def __post_init__(self):
        # everything checked before a Llama allocates a tensor: one line naming the field
        for name in SIZE_FIELDS:
            require_positive_int("LlamaConfig", name, getattr(self, name))
        if self.d_mlp is None:
            self.d_mlp = swiglu_width(self.d_model)
        require_positive_int("LlamaConfig", "d_mlp", self.d_mlp)
        if self.n_head % self.n_kv_head:
            raise ValueError(f"LlamaConfig.n_head={self.n_head} is not divisible by n_kv_head={self.n_kv_head}")
        if self.head_dim is None:
            if self.d_model % self.n_head:
                raise ValueError(f"LlamaConfig.d_model={self.d_model} is not divisible by n_head={self.n_head} "
                                 "(or give head_dim)")
            self.head_dim = self.d_model // self.n_head
        require_positive_int("LlamaConfig", "head_dim", self.head_dim)
        if self.head_dim % 2:
            raise ValueError(f"LlamaConfig.head_dim={self.head_dim} must be even (rotary positions rotate pairs)")
        theta = self.rope_theta
        if isinstance(theta, bool) or not isinstance(theta, numbers.Real) or not (math.isfinite(theta) and theta > 1):
            raise ValueError(f"LlamaConfig.rope_theta must be a finite number > 1, got {theta!r}")
        require_eps("LlamaConfig", self.eps)
        for name in ("tie_word_embeddings", "qkv_bias"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"LlamaConfig.{name} must be true or false, got {getattr(self, name)!r}")
        require_param_limit("LlamaConfig", self.param_count(),
                            f"n_layer={self.n_layer}, d_model={self.d_model}, n_head={self.n_head}, "
                            f"n_kv_head={self.n_kv_head}, head_dim={self.head_dim}, d_mlp={self.d_mlp}, "
                            f"vocab_size={self.vocab_size}")

    def param_count(self) -> int:
        """Exactly the parameters `Llama(self)` allocates (a tied head counted once)."""
        d, q, kv = self.d_model, self.n_head * self.head_dim, self.n_kv_head * self.head_dim
        attn = d * q + 2 * d * kv + q * d + ((q + 2 * kv) if self.qkv_bias else 0)
        block = attn + 3 * d * self.d_mlp + 2 * d
        head = d + (0 if self.tie_word_embeddings else self.vocab_size * d)
        return self.vocab_size * d + self.n_layer * block + head

    def to_dict(self) -> dict:
        return asdict(self)


class LlamaAttention(nn.Module):
    """Parameters only: q (n_head * head_dim rows), k and v (n_kv_head * head_dim rows), o."""

    def __init__(self, c: LlamaConfig):
        super().__init__()
        q, kv = c.n_head * c.head_dim, c.n_kv_head * c.head_dim
        self.q = nn.Linear(c.d_model, q, bias=c.qkv_bias)
        self.k = nn.Linear(c.d_model, kv, bias=c.qkv_bias)
        self.v = nn.Linear(c.d_model, kv, bias=c.qkv_bias)
        self.o = nn.Linear(q, c.d_model, bias=False)


class LlamaMLP(nn.Module):
    """Parameters only: fc2(silu(gate x) * fc1 x); fc1 is LLaMA's up_proj, fc2 its down_proj."""

    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.gate = nn.Linear(c.d_model, c.d_mlp, bias=False)
        self.fc1 = nn.Linear(c.d_model, c.d_mlp, bias=False)
        self.fc2 = nn.Linear(c.d_mlp, c.d_model, bias=False)


class Llama(FunctionalLanguageModel):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        c = self.config = config
        self._decoder(c, "rmsnorm", lambda: LlamaAttention(c), lambda: LlamaMLP(c))

    def arch(self) -> Arch:
        c = self.config
        return Arch.llama(c.n_layer, c.d_model, c.n_head, c.d_mlp, n_kv_head=c.n_kv_head, eps=float(c.eps),
                          rope_theta=float(c.rope_theta), head_dim=c.head_dim, qkv_bias=c.qkv_bias)
