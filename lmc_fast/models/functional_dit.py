"""DiT's pieces of the one functional forward (models/functional.py dispatches here for `arch.conditioned`).

A class-conditional diffusion Transformer (Peebles & Xie): patches of the noisy image x_t plus fixed sin-cos
positions on the stream; a conditioning vector c = t_embed.fc2(silu(t_embed.fc1 f(t))) + y_embed[y] from the
timestep's sinusoidal features f(t) and the class; each block adaLN-Zero modulated by silu(c):
    x <- x + gate1 * attn(LN(x) * (1 + scale1) + shift1),  x <- x + gate2 * mlp(LN(x) * (1 + scale2) + shift2)
with LN without parameters (epsilon arch.eps; the MLP branch's arch.mlp_eps where set, as in diffusers' DiT) and
each of shift / scale / gate a linear map of silu(c); the output layer out(LN(x) * (1 + final.scale) + final.shift)
predicts the noise of every patch (with arch.learn_sigma, then its variance, which the forward drops).

The engines want the embeddings linear in the parameters (they mix the end models' embeddings, then run
the rest per mixture), so `embed_sum` returns the linear parts as extra tokens in front of the patches:
token 0 the timestep MLP's first layer t_embed.fc1 f(t) (width d_model, as in DiT), token 1 the class
embedding; `condition` (the forward's per-mixture step after mixing) turns them into c, and the blocks
carry c as token 0 of the stream: (K, B, 1 + N, d). The residual stream proper is tokens 1.. (what
"resid.L" records).

Inputs are one tensor (B, C + 2, H, W): the noisy image, then two constant planes holding the timestep
and the class (`pack_inputs`), so every engine and check takes a DiT batch as it takes images.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

#: the largest timestep a packed input may hold (DDPM's 1000 steps; DiT's schedule)
MAX_TIMESTEPS = 1000
EMBEDDING_NAMES = ("patch_embed.weight", "patch_embed.bias", "pos_embed", "t_embed.fc1.weight", "t_embed.fc1.bias",
                   "y_embed.weight")
#: the six per-channel modulations of a block, each a linear map of silu(c) (standard names blocks.L.mod.*)
MODULATIONS = ("shift1", "scale1", "gate1", "shift2", "scale2", "gate2")


def pack_inputs(x_t: torch.Tensor, t: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """(B, C, H, W) noisy images, (B,) timesteps, (B,) classes -> the (B, C + 2, H, W) input of a DiT."""
    B, _, H, W = x_t.shape
    planes = torch.stack([t.to(x_t.dtype), y.to(x_t.dtype)], dim=1)[:, :, None, None].expand(B, 2, H, W)
    return torch.cat([x_t, planes], dim=1)


def unpack_inputs(inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The inverse of `pack_inputs`: x_t (B, C, H, W), timesteps (B,) float, classes (B,) long."""
    return inputs[:, :-2], inputs[:, -2, 0, 0], inputs[:, -1, 0, 0].round().long()


def timestep_features(t: torch.Tensor, dim: int, shift: int = 0) -> torch.Tensor:
    """DiT's sinusoidal timestep features (B, dim): cos then sin of t * 10000^(-i / (dim / 2 - shift)), in float64
    and cast to t's dtype (shift: diffusers' downscale_freq_shift, 1 in its DiT; DiT's own code has 0)."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float64, device=t.device) / (half - shift))
    args = t.to(torch.float64)[:, None] * freqs[None]
    return torch.cat([args.cos(), args.sin()], dim=-1).to(t.dtype)


def sincos_positions(side: int, d: int) -> torch.Tensor:
    """DiT's fixed 2-D sin-cos positions (side * side, d): half the channels for rows, half for columns."""
    def one_axis(pos, dim):
        omega = 1.0 / 10000 ** (torch.arange(dim // 2, dtype=torch.float64) / (dim / 2))
        out = pos.reshape(-1)[:, None].double() * omega[None]
        return torch.cat([out.sin(), out.cos()], dim=1)

    grid = torch.arange(side, dtype=torch.float64)
    rows, cols = torch.meshgrid(grid, grid, indexing="ij")
    return torch.cat([one_axis(rows, d // 2), one_axis(cols, d // 2)], dim=1).float()


def embed_sum(arch, ops, inputs: torch.Tensor) -> torch.Tensor:
    """(K, B, 2 + N, d): the timestep MLP's first layer, the class embedding, the patches plus positions;
    each linear in the parameters."""
    from .vit import patchify

    p = ops.p
    K = p["patch_embed.weight"].shape[0]
    x_t, t, y = unpack_inputs(inputs)
    C = x_t.shape[1]
    patch = int(round((p["patch_embed.weight"].shape[-1] / C) ** 0.5))
    x = ops.linear(patchify(x_t, patch).unsqueeze(0).expand(K, -1, -1, -1), "patch_embed") + p["pos_embed"].unsqueeze(1)
    feats = timestep_features(t, arch.freq_dim, arch.freq_shift).unsqueeze(0).expand(K, -1, -1)
    t_pre = ops.linear(feats, "t_embed.fc1")  # (K, B, d)
    y_emb = p["y_embed.weight"][:, y]  # (K, B, d)
    return torch.cat([t_pre.unsqueeze(2), y_emb.unsqueeze(2), x], dim=2)


def condition(arch, ops, h: torch.Tensor, record=None) -> torch.Tensor:
    """Mixed embeddings (K, B, 2 + N, d) -> the stream (K, B, 1 + N, d) carrying c as token 0."""
    t_hidden = F.silu(h[:, :, 0])
    c = ops.linear(t_hidden, "t_embed.fc2") + h[:, :, 1]
    if record is not None:
        record("t_embed", t_hidden), record("cond", c)
    return torch.cat([c.unsqueeze(2), h[:, :, 2:]], dim=2)


def _modulated(arch, x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor,
               eps: float | None = None) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), eps=arch.eps if eps is None else eps) * (1 + scale) + shift


def block(arch, ops, l: int, h: torch.Tensor, attention, mlp, record=None) -> torch.Tensor:
    """Block `l` on the carried stream; `attention` and `mlp` are the functional forward's own branches."""
    c, x = h[:, :, :1], h[:, :, 1:]
    if record is not None:
        record(f"resid.{l}", x)
    sc = F.silu(c)
    mod = {n: ops.linear(sc, f"blocks.{l}.mod.{n}") for n in MODULATIONS}  # (K, B, 1, d): the same for every token
    x = x + mod["gate1"] * attention(arch, ops, l, _modulated(arch, x, mod["shift1"], mod["scale1"]), record)
    x = x + mod["gate2"] * mlp(arch, ops, l, _modulated(arch, x, mod["shift2"], mod["scale2"], arch.mlp_eps), record)
    return torch.cat([c, x], dim=2)


def stream(h: torch.Tensor) -> torch.Tensor:
    """The residual stream proper of a carried (K, B, 1 + N, d) state."""
    return h[:, :, 1:]


def head(arch, ops, h: torch.Tensor) -> torch.Tensor:
    """The predicted noise of every patch, (K, B, N, C * p * p) in `patchify`'s layout (with learn_sigma the
    first half of `out`'s rows: the variance rows after them are not part of the task)."""
    sc = F.silu(h[:, :, :1])
    x = _modulated(arch, h[:, :, 1:], ops.linear(sc, "final.shift"), ops.linear(sc, "final.scale"))
    y = ops.linear(x, "out")
    return y[..., : y.shape[-1] // 2] if arch.learn_sigma else y
