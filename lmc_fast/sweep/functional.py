"""A functional forward pass over standard parameters with a leading batch axis K.

Every parameter carries a leading axis of K models (K interpolation points in a sweep, or
K = 1); inputs are shared. Linear layers run as one batched GEMM over K, so a sweep of K
points is a single pass. The same code runs the reference models and the Hugging Face ones
(they map to the same standard parameters), and `record` exposes the activations that
activation matching needs.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..models.adapters import Arch
from ..models.blocks import ACTIVATIONS
from ..models.vit import patchify

Recorder = "callable(name: str, tensor: Tensor) | None"


def linear(x: torch.Tensor, W: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """x (K, ..., in), W (K, out, in), b (K, out) -> (K, ..., out) as one batched GEMM."""
    K, shape = x.shape[0], x.shape[1:-1]
    x2 = x.reshape(K, -1, x.shape[-1])
    y = torch.bmm(x2, W.transpose(1, 2)) if b is None else torch.baddbmm(b.unsqueeze(1), x2, W.transpose(1, 2))
    return y.reshape(K, *shape, W.shape[1])


def _per_k(v: torch.Tensor, ndim: int) -> torch.Tensor:
    """(K, d) -> (K, 1, ..., 1, d) to broadcast against a (K, ..., d) tensor of `ndim` dims."""
    return v.reshape(v.shape[0], *([1] * (ndim - 2)), v.shape[-1])


def norm(arch: Arch, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    d = x.shape[-1]
    if arch.norm == "layernorm":
        y = F.layer_norm(x, (d,), eps=arch.eps)
    else:
        y = F.rms_norm(x, (d,), eps=arch.eps)
    y = y * _per_k(weight, x.dim())
    return y if bias is None else y + _per_k(bias, x.dim())


def embedding_names(arch: Arch) -> tuple[str, ...]:
    """The parameters `embed` reads: all a sweep needs of its end models, unmixed."""
    if arch.family == "vit":
        return ("patch_embed.weight", "patch_embed.bias", "cls_token", "pos_embed")
    return ("tok_embed.weight", "pos_embed")


def embed(arch: Arch, p: dict, inputs: torch.Tensor) -> torch.Tensor:
    """Residual stream after the embeddings: (K, B, T, d)."""
    if arch.family == "vit":
        C = inputs.shape[1]
        patch = int(round((p["patch_embed.weight"].shape[-1] / C) ** 0.5))
        x = linear(patchify(inputs, patch).unsqueeze(0).expand(p["patch_embed.weight"].shape[0], -1, -1, -1),
                   p["patch_embed.weight"], p["patch_embed.bias"])
        cls = p["cls_token"][:, None, None, :].expand(-1, x.shape[1], 1, -1)
        return torch.cat([cls, x], dim=2) + p["pos_embed"].unsqueeze(1)
    T = inputs.shape[1]
    tok = p["tok_embed.weight"][:, inputs]  # (K, B, T, d)
    return tok + p["pos_embed"][:, None, :T]


def attention(arch: Arch, p: dict, l: int, x: torch.Tensor, record=None) -> torch.Tensor:
    b = f"blocks.{l}.attn."
    K, B, T, d = x.shape
    H = arch.n_head
    q, k, v = (linear(x, p[b + n + ".weight"], p[b + n + ".bias"]) for n in "qkv")
    if record is not None:
        record(f"q.{l}", q), record(f"k.{l}", k), record(f"v.{l}", v)
    heads = lambda t: t.reshape(K * B, T, H, d // H).transpose(1, 2)
    y = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), is_causal=arch.family == "gpt2")
    y = y.transpose(1, 2).reshape(K, B, T, d)
    return linear(y, p[b + "o.weight"], p[b + "o.bias"])


def mlp(arch: Arch, p: dict, l: int, x: torch.Tensor, record=None) -> torch.Tensor:
    b = f"blocks.{l}.mlp."
    z = ACTIVATIONS[arch.activation](linear(x, p[b + "fc1.weight"], p[b + "fc1.bias"]))
    if record is not None:
        record(f"mlp.{l}", z)
    return linear(z, p[b + "fc2.weight"], p[b + "fc2.bias"])


def blocks(arch: Arch, p: dict, h: torch.Tensor, record=None) -> torch.Tensor:
    for l in range(arch.n_layer):
        if record is not None:
            record(f"resid.{l}", h)
        b = f"blocks.{l}."
        h = h + attention(arch, p, l, norm(arch, h, p[b + "ln1.weight"], p.get(b + "ln1.bias")), record)
        h = h + mlp(arch, p, l, norm(arch, h, p[b + "ln2.weight"], p.get(b + "ln2.bias")), record)
    if record is not None:
        record(f"resid.{arch.n_layer}", h)
    return h


def head(arch: Arch, p: dict, h: torch.Tensor) -> torch.Tensor:
    if arch.family == "vit":
        h = h[:, :, 0]
    h = norm(arch, h, p["ln_f.weight"], p.get("ln_f.bias"))
    name = arch.head_name
    return linear(h, p[name + ".weight"], p.get(name + ".bias"))


def forward(arch: Arch, p: dict, inputs: torch.Tensor, record=None) -> torch.Tensor:
    """Logits (K, B, classes) or (K, B, T, vocab) for K stacked parameter sets."""
    return head(arch, p, blocks(arch, p, embed(arch, p, inputs), record))


def stack(params_list: list[dict]) -> dict:
    """K parameter dicts -> one dict with a leading K axis."""
    return {k: torch.stack([p[k] for p in params_list]) for k in params_list[0]}
