"""Reference class-conditional diffusion Transformer (DiT, adaLN-Zero), small enough to train on 8x8 images.

The modules only hold the parameters, under the standard names (lmc_fast/models/arch.py): `patch_embed`,
`pos_embed` (DiT's fixed 2-D sin-cos positions, stored so that an alignment can move them), `t_embed.fc1/fc2`,
`y_embed` (one row per class and a last, null row for classifier-free guidance), per block
`mod.{shift1, scale1, gate1, shift2, scale2, gate2}`, `attn.q/k/v/o`, `mlp.fc1/fc2`, then `final.shift/scale`
and `out`. The forward pass is the library's functional forward (models/functional_dit.py) with K = 1, so
the model, sweeps and matching compute the same function. It predicts the noise of x_t; the task, the
noise schedule and the sampler are in lmc_fast/diffusion.py.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn

from .arch import Arch
from .blocks import (ACTIVATIONS, require_choice, require_eps, require_heads_divide, require_param_limit,
                     require_positive_int)
from .functional_dit import MODULATIONS, pack_inputs, sincos_positions

SIZE_FIELDS = ("image_size", "patch_size", "channels", "num_classes", "d_model", "n_layer", "n_head", "d_mlp",
               "freq_dim")


@dataclass
class DiTConfig:
    image_size: int = 8
    patch_size: int = 2
    channels: int = 1
    num_classes: int = 10
    d_model: int = 64
    n_layer: int = 4
    n_head: int = 4
    d_mlp: int = 256
    freq_dim: int = 64  # sinusoidal timestep features (DiT: 256)
    eps: float = 1e-6
    activation: str = "gelu_tanh"
    # DiT as diffusers computes it (so that a converted diffusers DiT keeps its function): the timestep features'
    # downscale_freq_shift (None: 0) and the MLP branch's norm epsilon (None: eps); DiT's own code has neither
    freq_shift: int | None = None
    mlp_eps: float | None = None

    @classmethod
    def tiny(cls, **overrides) -> "DiTConfig":
        """The DiT trained here on 8x8 digits and Fashion-MNIST: 16 patches of 2x2, width 64, 4 layers."""
        return cls(**overrides)

    @property
    def n_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    def __post_init__(self):
        for name in SIZE_FIELDS:
            require_positive_int("DiTConfig", name, getattr(self, name))
        if self.image_size % self.patch_size:
            raise ValueError(f"DiTConfig.image_size {self.image_size} is not divisible by patch_size {self.patch_size}")
        require_heads_divide("DiTConfig", "d_model", self.d_model, self.n_head)
        if self.d_model % 4 or self.freq_dim % 2:
            raise ValueError(f"DiTConfig needs d_model divisible by 4 (2-D sin-cos positions) and an even freq_dim, "
                             f"got d_model={self.d_model}, freq_dim={self.freq_dim}")
        require_choice("DiTConfig", "activation", self.activation, ACTIVATIONS)
        require_eps("DiTConfig", self.eps)
        if self.mlp_eps is not None and not (isinstance(self.mlp_eps, float) and 0 < self.mlp_eps < 1):
            raise ValueError(f"DiTConfig.mlp_eps must be None or a float in (0, 1), got {self.mlp_eps!r}")
        if self.freq_shift is not None and (type(self.freq_shift) is not int
                                            or not 0 <= self.freq_shift < self.freq_dim // 2):
            raise ValueError(f"DiTConfig.freq_shift must be None or an integer in [0, freq_dim / 2), "
                             f"got {self.freq_shift!r}")
        require_param_limit("DiTConfig", self.param_count(),
                            f"n_layer={self.n_layer}, d_model={self.d_model}, d_mlp={self.d_mlp}")

    def param_count(self) -> int:
        """Exactly the parameters `DiT(self)` allocates (the fixed positions included)."""
        d, pix = self.d_model, self.channels * self.patch_size**2
        embed = pix * d + d + self.n_patches * d + (self.freq_dim * d + d) + (d * d + d) + (self.num_classes + 1) * d
        block = len(MODULATIONS) * (d * d + d) + 4 * (d * d + d) + (d * self.d_mlp + self.d_mlp) + (self.d_mlp * d + d)
        return embed + self.n_layer * block + 2 * (d * d + d) + d * pix + pix

    def to_dict(self) -> dict:
        return asdict(self)


def _linears(names, d_in: int, d_out: int) -> nn.Module:
    m = nn.Module()
    for n in names:
        setattr(m, n, nn.Linear(d_in, d_out))
    return m


class DiTBlock(nn.Module):
    def __init__(self, c: DiTConfig):
        super().__init__()
        d = c.d_model
        self.mod = _linears(MODULATIONS, d, d)
        self.attn = _linears("qkvo", d, d)
        self.mlp = nn.Module()
        self.mlp.fc1, self.mlp.fc2 = nn.Linear(d, c.d_mlp), nn.Linear(c.d_mlp, d)


class DiT(nn.Module):
    def __init__(self, config: DiTConfig):
        super().__init__()
        c = self.config = config
        d, pix = c.d_model, c.channels * c.patch_size**2
        self.patch_embed = nn.Linear(pix, d)
        # fixed, as in DiT (not trained), but a parameter: alignments permute it with the stream
        self.pos_embed = nn.Parameter(sincos_positions(c.image_size // c.patch_size, d), requires_grad=False)
        self.t_embed = nn.Module()
        self.t_embed.fc1, self.t_embed.fc2 = nn.Linear(c.freq_dim, d), nn.Linear(d, d)
        self.y_embed = nn.Embedding(c.num_classes + 1, d)
        self.blocks = nn.ModuleList(DiTBlock(c) for _ in range(c.n_layer))
        self.final = _linears(("shift", "scale"), d, d)
        self.out = nn.Linear(d, pix)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """DiT's initialisation: Xavier-uniform linears, N(0, 0.02) embeddings, and adaLN-Zero: every
        modulation and the output layer zero, so each block starts as the identity."""
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)
        nn.init.normal_(self.y_embed.weight, std=0.02)
        nn.init.normal_(self.t_embed.fc1.weight, std=0.02)
        nn.init.normal_(self.t_embed.fc2.weight, std=0.02)
        zero = [getattr(b.mod, n) for b in self.blocks for n in MODULATIONS] + [self.final.shift, self.final.scale,
                                                                                 self.out]
        for m in zero:
            nn.init.zeros_(m.weight), nn.init.zeros_(m.bias)

    def arch(self) -> Arch:
        c = self.config
        return Arch.dit(c.n_layer, c.d_model, c.n_head, c.d_mlp, c.freq_dim, eps=float(c.eps), activation=c.activation,
                        freq_shift=c.freq_shift or 0, mlp_eps=None if c.mlp_eps is None else float(c.mlp_eps))

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """Packed inputs (B, C + 2, H, W) (functional_dit.pack_inputs) -> predicted noise (B, C, H, W)."""
        c = self.config
        if inputs.dim() != 4 or inputs.shape[1:] != (c.channels + 2, c.image_size, c.image_size):
            raise ValueError(f"DiT expects packed inputs of shape (B, {c.channels + 2}, {c.image_size}, {c.image_size}) "
                             f"(the image, then timestep and class planes), got {tuple(inputs.shape)}")
        from . import functional as Fn  # here, not at import: functional imports this package's models

        params = {name: p.unsqueeze(0) for name, p in self.named_parameters()}
        return unpatchify(Fn.forward(self.arch(), params, inputs)[0], c.patch_size, c.channels)

    def predict_noise(self, x_t: torch.Tensor, t: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self(pack_inputs(x_t, t, y))


def unpatchify(x: torch.Tensor, p: int, channels: int) -> torch.Tensor:
    """(B, N, C*p*p) in `patchify`'s layout -> (B, C, H, W)."""
    B, N, _ = x.shape
    side = int(round(N ** 0.5))
    x = x.reshape(B, side, side, channels, p, p).permute(0, 3, 1, 4, 2, 5)
    return x.reshape(B, channels, side * p, side * p)
