"""The one functional forward pass over standard parameters with a leading batch axis K.

Every parameter carries a leading axis of K models (K interpolation points in a sweep, or
K = 1); inputs are shared. Linear layers run as one batched GEMM over K, so a sweep of K
points is a single pass. The same code runs the reference models and the Hugging Face ones
(they map to the same standard parameters), and `record` exposes the activations that
activation matching needs. Every architecture choice is read from the `Arch` fields (inputs,
positions (partial rotary too), heads and key/value heads, gated MLP, biases, pooling, sequential,
parallel or post-norm residual blocks, token types and the heads' pooler and transform).

The blocks and the head read their weights through `ops` (`linear(x, name)`, `norm(x, name)`):
`StackedOps` holds K parameter sets; the Triton path (lerp_kernel.py) passes ops that mix two
end models inside the GEMM, and runs this same forward.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from . import functional_dit as dit
from . import mamba
from .arch import Arch
from .blocks import ACTIVATIONS
from .vit import patchify

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
    """weight, bias (K, d) or (1, d). Each operation here writes a new activation-sized tensor, and a fresh
    large allocation costs page faults that can exceed the arithmetic (an unfused LayerNorm + scale + shift
    of 64 x 65 x 256 floats: 9 ms against 0.4 ms fused, on a 2-core VM): one parameter set takes the fused
    norm, K of them one fused multiply-add after the plain norm."""
    d = x.shape[-1]
    if weight.shape[0] == 1:
        if arch.norm == "layernorm":
            return F.layer_norm(x, (d,), weight[0], None if bias is None else bias[0], eps=arch.eps)
        y = F.rms_norm(x, (d,), weight[0], eps=arch.eps)
        return y if bias is None else y + bias[0]
    if arch.norm == "layernorm":
        y = F.layer_norm(x, (d,), eps=arch.eps)
    else:
        y = F.rms_norm(x, (d,), eps=arch.eps)
    w = _per_k(weight, x.dim())
    return y * w if bias is None else torch.addcmul(_per_k(bias, x.dim()), y, w)


def embedding_names(arch: Arch) -> tuple[str, ...]:
    """The parameters `embed_sum` reads: all a sweep needs of its end models, unmixed."""
    if arch.conditioned:
        return dit.EMBEDDING_NAMES
    if arch.inputs == "patches":
        return ("patch_embed.weight", "patch_embed.bias", "cls_token", "pos_embed")
    names = ("tok_embed.weight",) + (("pos_embed",) if arch.positions == "learned" else ())
    return names + (("type_embed",) if arch.token_types else ())


def embed(arch: Arch, p: dict, inputs: torch.Tensor, record=None) -> torch.Tensor:
    """Residual stream after the embeddings: (K, B, T, d)."""
    return embed_norm(arch, p, embed_sum(arch, p, inputs), record)


def embed_norm(arch: Arch, p, h: torch.Tensor, record=None) -> torch.Tensor:
    """What follows the embeddings' (mixed) sum, per mixture: BERT's norm (ln_emb), DiT's conditioning
    vector (functional_dit.condition); the identity for other models."""
    if arch.conditioned:
        return dit.condition(arch, _ops(arch, p), h, record)
    return _ops(arch, p).norm(h, "ln_emb") if arch.embed_norm else h


def embed_sum(arch: Arch, p: dict, inputs: torch.Tensor) -> torch.Tensor:
    """The embeddings' sum before any norm, (K, B, T, d): linear in the parameters, so a sweep mixes
    the end models' sums instead of their tables."""
    if arch.conditioned:
        return dit.embed_sum(arch, _ops(arch, p), inputs)
    if arch.inputs == "patches":
        C = inputs.shape[1]
        patch = int(round((p["patch_embed.weight"].shape[-1] / C) ** 0.5))
        x = linear(patchify(inputs, patch).unsqueeze(0).expand(p["patch_embed.weight"].shape[0], -1, -1, -1),
                   p["patch_embed.weight"], p["patch_embed.bias"])
        cls = p["cls_token"][:, None, None, :].expand(-1, x.shape[1], 1, -1)
        return torch.cat([cls, x], dim=2) + p["pos_embed"].unsqueeze(1)
    T = inputs.shape[1]
    h = p["tok_embed.weight"][:, inputs]  # (K, B, T, d)
    if arch.positions == "learned":
        off = arch.position_offset  # RoBERTa's positions start after its padding id
        h = h + p["pos_embed"][:, None, off:off + T]
    if arch.token_types:  # one segment: every token has type 0
        h = h + p["type_embed"][:, None, None, 0]
    return h


def rope_tables(arch: Arch, T: int, dtype, device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin (T, r) of rotary positions on the first r = rotary_dim dims of a head, Hugging Face's
    layout: dimension i and i + r / 2 form the plane of frequency theta^(-2i / r)."""
    r = arch.rotary_dim
    inv_freq = 1.0 / arch.rope_theta ** (torch.arange(0, r, 2, dtype=torch.float64, device=device) / r)
    angles = torch.arange(T, dtype=torch.float64, device=device)[:, None] * inv_freq[None]
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (..., T, d_h) rotated plane by plane on its first r = cos.shape[-1] dims: x cos + rotate_half(x) sin;
    the other d_h - r dims pass unchanged (GPT-NeoX's partial rotary)."""
    r = cos.shape[-1]
    if r < x.shape[-1]:
        return torch.cat([apply_rope(x[..., :r], cos, sin), x[..., r:]], dim=-1)
    half = r // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def _attn_mask(arch: Arch, T: int, device) -> torch.Tensor | None:
    """None (full or plain causal attention, left to SDPA) or a boolean (T, T) mask of the keys each
    query sees: causal and within the sliding window."""
    if arch.window is None or arch.window >= T:
        return None
    i = torch.arange(T, device=device)
    offset = i[:, None] - i[None, :]
    return (offset >= 0) & (offset < arch.window)


class StackedOps:
    """Linear layers and norms of K stacked parameter sets (the plain forward)."""

    def __init__(self, arch: Arch, p: dict):
        self.arch, self.p = arch, p

    def linear(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return linear(x, self.p[name + ".weight"], self.p.get(name + ".bias"))

    def norm(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return norm(self.arch, x, self.p[name + ".weight"], self.p.get(name + ".bias"))

    def tensor(self, name: str) -> torch.Tensor:
        """One parameter, (K, ...): what Mamba's conv, A_log and D read."""
        return self.p[name]


def _ops(arch: Arch, p) -> StackedOps:
    return p if hasattr(p, "linear") else StackedOps(arch, p)


def attention(arch: Arch, p, l: int, x: torch.Tensor, record=None) -> torch.Tensor:
    ops, b = _ops(arch, p), f"blocks.{l}.attn."
    K, B, T, _ = x.shape
    H, G, dh = arch.n_head, arch.n_kv_head, arch.head_dim
    q, k, v = (ops.linear(x, b + n) for n in "qkv")
    if record is not None:
        record(f"q.{l}", q), record(f"k.{l}", k), record(f"v.{l}", v)
    heads = lambda t, n: t.reshape(K * B, T, n, dh).transpose(1, 2)  # noqa: E731
    q, k, v = heads(q, H), heads(k, G), heads(v, G)
    if arch.rotary:
        cos, sin = rope_tables(arch, T, q.dtype, q.device)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    mask = _attn_mask(arch, T, x.device) if arch.causal else None
    scale = arch.attn_scale(l)
    if mask is None:
        # every query head of a group reads its key / value head; SDPA does it without copying k and v
        # (fwd + bwd of a tiny LLaMA's attention 1.2-1.7x faster on the CPU than the expanded copies)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=arch.causal, scale=scale, enable_gqa=G != H)
    else:
        if G != H:
            k, v = k.repeat_interleave(H // G, dim=1), v.repeat_interleave(H // G, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    return ops.linear(y.transpose(1, 2).reshape(K, B, T, H * dh), b + "o")


def mlp(arch: Arch, p, l: int, x: torch.Tensor, record=None) -> torch.Tensor:
    ops, b = _ops(arch, p), f"blocks.{l}.mlp."
    act = ACTIVATIONS[arch.activation]
    if arch.gated:
        z = act(ops.linear(x, b + "gate")) * ops.linear(x, b + "fc1")
    else:
        z = act(ops.linear(x, b + "fc1"))
    if record is not None:
        record(f"mlp.{l}", z)
    return ops.linear(z, b + "fc2")


def block(arch: Arch, p, l: int, h: torch.Tensor, record=None) -> torch.Tensor:
    """The residual stream after block `l` (a streamed sweep runs them one at a time)."""
    ops = _ops(arch, p)
    if arch.conditioned:
        return dit.block(arch, ops, l, h, attention, mlp, record)
    if record is not None:
        record(f"resid.{l}", h)
    b = f"blocks.{l}."
    if arch.mamba:  # the mixer is the whole block: no attention, no MLP
        return h + mamba.mixer(arch, ops, l, ops.norm(h, b + "ln1"), record)
    if arch.post_norm:  # BERT: each sum is normalised on the stream itself
        h = ops.norm(h + attention(arch, ops, l, h, record), b + "ln1")
        return ops.norm(h + mlp(arch, ops, l, h, record), b + "ln2")
    if arch.parallel:  # both branches read the same stream (GPT-NeoX's use_parallel_residual)
        a = attention(arch, ops, l, ops.norm(h, b + "ln1"), record)
        return h + a + mlp(arch, ops, l, ops.norm(h, b + "ln2"), record)
    h = h + attention(arch, ops, l, ops.norm(h, b + "ln1"), record)
    return h + mlp(arch, ops, l, ops.norm(h, b + "ln2"), record)


def blocks(arch: Arch, p, h: torch.Tensor, record=None) -> torch.Tensor:
    ops = _ops(arch, p)
    for l in range(arch.n_layer):
        h = block(arch, ops, l, h, record)
    if record is not None:
        record(f"resid.{arch.n_layer}", dit.stream(h) if arch.conditioned else h)
    return h


def head(arch: Arch, p, h: torch.Tensor, record=None) -> torch.Tensor:
    ops = _ops(arch, p)
    if arch.conditioned:
        return dit.head(arch, ops, h)
    if arch.pooler and arch.pooling != "cls" and record is not None:
        # the next-sentence head's pooler: not in the logits, recorded for activation matching
        record("pooler", torch.tanh(ops.linear(h[:, :, 0], "pooler")))
    if arch.pooling == "cls":
        h = h[:, :, 0]
    if arch.pooler and arch.pooling == "cls":
        h = torch.tanh(ops.linear(h, "pooler"))
        if record is not None:
            record("pooler", h)
    elif not arch.post_norm:  # a post-norm stream is normalised already
        h = ops.norm(h, "ln_f")
    if arch.head_transform:
        h = ops.norm(ACTIVATIONS[arch.activation](ops.linear(h, "head_dense")), "ln_head")
        if record is not None:
            record("head_transform", h)
    return ops.linear(h, arch.head_name)


def forward(arch: Arch, p: dict, inputs: torch.Tensor, record=None) -> torch.Tensor:
    """Logits (K, B, classes) or (K, B, T, vocab) for K stacked parameter sets."""
    ops = StackedOps(arch, p)
    return head(arch, ops, blocks(arch, ops, embed(arch, p, inputs, record), record), record)


def stack(params_list: list[dict]) -> dict:
    """K parameter dicts -> one dict with a leading K axis."""
    return {k: torch.stack([p[k] for p in params_list]) for k in params_list[0]}
