"""The pre-LN Transformer block shared by the reference ViT and GPT-2.

State-dict names read like the math of docs/ARCHITECTURE.md, section 1: `attn.q`, `attn.k`, `attn.v`,
`attn.o`, `mlp.fc1`, `mlp.fc2`, `ln1`, `ln2`. Weights use nn.Linear's (out, in) layout.
"""
from __future__ import annotations

import math
import numbers

import torch
import torch.nn.functional as F
from torch import nn

NORMS = ("layernorm", "rmsnorm")
ACTIVATIONS = {"gelu": lambda x: F.gelu(x), "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
               "silu": lambda x: F.silu(x)}

#: Largest model a config may describe: 2**34 (about 17 billion) parameters, 64 GiB in fp32.
#: Past it a size is a typo, and the allocation would take the machine down instead of failing.
MAX_PARAMS = 2**34


# ---------------------------------------------------------------- config checks (before allocating)


def require_positive_int(owner: str, field: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{owner}.{field} must be a positive int, got {value!r}")


def require_choice(owner: str, field: str, value, choices) -> None:
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{owner}.{field} must be one of {tuple(choices)}, got {value!r}")


def require_eps(owner: str, value) -> None:
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    if not ok:
        raise ValueError(f"{owner}.eps must be a finite number > 0, got {value!r}")


def require_heads_divide(owner: str, width_field: str, width: int, n_head: int) -> None:
    if width % n_head:
        raise ValueError(f"{owner}.{width_field}={width} is not divisible by n_head={n_head}")


def norm_param_count(d: int, norm: str) -> int:
    return 2 * d if norm == "layernorm" else d


def block_param_count(d: int, d_mlp: int, norm: str, qkv_bias: bool = True) -> int:
    """Parameters of one `Block`: q, k, v, o (with biases; q/k/v's only with qkv_bias), the MLP, two norms."""
    return 4 * d * d + (4 if qkv_bias else 1) * d + (d * d_mlp + d_mlp) + (d_mlp * d + d) + 2 * norm_param_count(d, norm)


def require_param_limit(owner: str, count: int, sizes: str) -> None:
    """Refuse a config whose (exact, integer) parameter count is past MAX_PARAMS."""
    if count > MAX_PARAMS:
        raise ValueError(f"{owner}({sizes}) describes about {count:.3g} parameters, more than the limit of "
                         f"2**34 = {MAX_PARAMS:.3g}; check the sizes")


class Norm(nn.Module):
    """LayerNorm (weight and bias) or RMSNorm (weight only)."""

    def __init__(self, d: int, kind: str = "layernorm", eps: float = 1e-5):
        super().__init__()
        if kind not in NORMS:
            raise ValueError(f"norm must be one of {NORMS}, got {kind!r}")
        self.kind, self.eps = kind, eps
        self.weight = nn.Parameter(torch.ones(d))
        self.bias = nn.Parameter(torch.zeros(d)) if kind == "layernorm" else None

    def forward(self, x):
        if self.kind == "layernorm":
            return F.layer_norm(x, x.shape[-1:], self.weight, self.bias, self.eps)
        return F.rms_norm(x, x.shape[-1:], self.weight, self.eps)


class Attention(nn.Module):
    def __init__(self, d: int, n_head: int, causal: bool, qkv_bias: bool = True):
        super().__init__()
        if d % n_head:
            raise ValueError(f"width {d} is not divisible by n_head {n_head}")
        self.n_head, self.causal = n_head, causal
        self.q, self.k, self.v = (nn.Linear(d, d, bias=qkv_bias) for _ in range(3))
        self.o = nn.Linear(d, d)

    def forward(self, x):
        B, T, d = x.shape
        split = lambda t: t.view(B, T, self.n_head, d // self.n_head).transpose(1, 2)
        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        scores = q @ k.transpose(-1, -2) / math.sqrt(d // self.n_head)
        if self.causal:
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
            scores = scores.masked_fill(mask, float("-inf"))
        y = scores.softmax(-1) @ v
        return self.o(y.transpose(1, 2).reshape(B, T, d))


class MLP(nn.Module):
    def __init__(self, d: int, d_mlp: int, activation: str):
        super().__init__()
        require_choice("MLP", "activation", activation, ACTIVATIONS)
        self.fc1, self.fc2 = nn.Linear(d, d_mlp), nn.Linear(d_mlp, d)
        self.act = ACTIVATIONS[activation]

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, d, n_head, d_mlp, *, norm, eps, activation, causal, qkv_bias=True):
        super().__init__()
        self.ln1, self.ln2 = Norm(d, norm, eps), Norm(d, norm, eps)
        self.attn = Attention(d, n_head, causal, qkv_bias)
        self.mlp = MLP(d, d_mlp, activation)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


def init_weights(module: nn.Module, std: float = 0.02):
    """GPT-2 style init: normal(0, std) for matrices and embeddings, zero biases."""
    for name, p in module.named_parameters():
        if p.is_meta:  # shapes only (checkpoint checks): no values, and nn.init there imports torch._dynamo (1.3 s)
            continue
        if name.endswith("bias"):
            nn.init.zeros_(p)
        elif p.dim() >= 2 or "embed" in name or "token" in name:
            nn.init.normal_(p, std=std)
