"""Reference Vision Transformer (pre-LN, CLS token, learned positions), nanoGPT style."""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn

from .blocks import (ACTIVATIONS, NORMS, Block, Norm, block_param_count, init_weights, norm_param_count,
                     require_choice, require_eps, require_heads_divide, require_param_limit, require_positive_int)

SIZE_FIELDS = ("image_size", "patch_size", "channels", "num_classes", "d_model", "n_layer", "n_head", "d_mlp")


@dataclass
class ViTConfig:
    image_size: int = 32
    patch_size: int = 4
    channels: int = 3
    num_classes: int = 10
    d_model: int = 256
    n_layer: int = 6
    n_head: int = 8
    d_mlp: int = 512
    norm: str = "layernorm"
    eps: float = 1e-5
    activation: str = "gelu"
    qkv_bias: bool = True  # False: q, k, v without biases (the canonical form keeps ln1's shift as a norm bias)

    @classmethod
    def paper(cls, **overrides) -> "ViTConfig":
        """The ViT of the paper: patch 4, width 256, MLP 512, 6 layers, 8 heads, 32x32x3."""
        return cls(**overrides)

    @classmethod
    def digits(cls, **overrides) -> "ViTConfig":
        """A small ViT for scikit-learn's 8x8 digits (1 channel, patch 2)."""
        base = dict(image_size=8, patch_size=2, channels=1, num_classes=10, d_model=64, n_layer=4, n_head=4, d_mlp=128)
        return cls(**{**base, **overrides})

    @classmethod
    def mnist(cls, **overrides) -> "ViTConfig":
        """A small ViT for 28x28 MNIST / Fashion-MNIST (1 channel, patch 7: 16 patches + CLS).

        Patch 7 rather than 4: on CPU it trains about 3x faster and reached higher Fashion-MNIST
        accuracy for the same budget (80.5% vs 76.1% after 237 steps on 10k images).
        """
        base = dict(image_size=28, patch_size=7, channels=1, num_classes=10, d_model=128, n_layer=4, n_head=4, d_mlp=256)
        return cls(**{**base, **overrides})

    @property
    def n_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    def __post_init__(self):
        # everything checked before a ViT allocates a tensor: one line naming the field
        for name in SIZE_FIELDS:
            require_positive_int("ViTConfig", name, getattr(self, name))
        if self.image_size % self.patch_size:
            raise ValueError(f"image_size {self.image_size} is not divisible by patch_size {self.patch_size}")
        require_heads_divide("ViTConfig", "d_model", self.d_model, self.n_head)
        require_choice("ViTConfig", "norm", self.norm, NORMS)
        require_choice("ViTConfig", "activation", self.activation, ACTIVATIONS)
        require_eps("ViTConfig", self.eps)
        if not isinstance(self.qkv_bias, bool):
            raise ValueError(f"ViTConfig.qkv_bias must be true or false, got {self.qkv_bias!r}")
        require_param_limit("ViTConfig", self.param_count(),
                            f"n_layer={self.n_layer}, d_model={self.d_model}, d_mlp={self.d_mlp}, "
                            f"image_size={self.image_size}, patch_size={self.patch_size}")

    def param_count(self) -> int:
        """Exactly the parameters `ViT(self)` allocates, from the sizes alone."""
        d, patch_in = self.d_model, self.channels * self.patch_size**2
        embed = patch_in * d + d + d + (self.n_patches + 1) * d  # patch_embed, cls_token, pos_embed
        head = norm_param_count(d, self.norm) + d * self.num_classes + self.num_classes
        return embed + self.n_layer * block_param_count(d, self.d_mlp, self.norm, self.qkv_bias) + head

    def to_dict(self) -> dict:
        return asdict(self)


def patchify(x: torch.Tensor, p: int) -> torch.Tensor:
    """(B, C, H, W) -> (B, N, C*p*p), flattened in Conv2d's (C, kh, kw) order."""
    B, C, H, W = x.shape
    x = x.reshape(B, C, H // p, p, W // p, p).permute(0, 2, 4, 1, 3, 5)
    return x.reshape(B, (H // p) * (W // p), C * p * p)


class ViT(nn.Module):
    def __init__(self, config: ViTConfig):
        super().__init__()
        c = self.config = config
        self.patch_embed = nn.Linear(c.channels * c.patch_size**2, c.d_model)
        self.cls_token = nn.Parameter(torch.zeros(c.d_model))
        self.pos_embed = nn.Parameter(torch.zeros(c.n_patches + 1, c.d_model))
        self.blocks = nn.ModuleList(
            Block(c.d_model, c.n_head, c.d_mlp, norm=c.norm, eps=c.eps, activation=c.activation, causal=False,
                  qkv_bias=c.qkv_bias)
            for _ in range(c.n_layer)
        )
        self.ln_f = Norm(c.d_model, c.norm, c.eps)
        self.head = nn.Linear(c.d_model, c.num_classes)
        init_weights(self)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        c = self.config
        if images.dim() != 4 or images.shape[1:] != (c.channels, c.image_size, c.image_size):
            raise ValueError(
                f"ViT expects images of shape (B, {c.channels}, {c.image_size}, {c.image_size}), got {tuple(images.shape)}"
            )
        x = self.patch_embed(patchify(images, c.patch_size))
        cls = self.cls_token.expand(x.shape[0], 1, -1)
        x = torch.cat([cls, x], dim=1) + self.pos_embed
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x[:, 0]))
