"""Input augmentations for the learned-matching loop: `augment(x, generator) -> x`.

Learned matching fits the alignment to a few thousand images at most; small input
perturbations keep it from fitting those images alone (see tests/test_real_data.py).
"""
from __future__ import annotations

import math

import torch

from ..numerics import dirichlet_weights


class RandomShift:
    """Shift each image by up to `pixels` in x and y (independently per image), filling the
    uncovered border with the image's own minimum (the background of normalised images)."""

    def __init__(self, pixels: int = 1):
        if pixels < 0:
            raise ValueError(f"pixels must be >= 0, got {pixels}")
        self.pixels = int(pixels)

    def __call__(self, x: torch.Tensor, gen: torch.Generator | None = None) -> torch.Tensor:
        if x.dim() != 4:
            raise ValueError(f"RandomShift expects (B, C, H, W) images, got shape {tuple(x.shape)}")
        p = self.pixels
        if p == 0:
            return x
        B, _, H, W = x.shape
        fill = x.amin(dim=(1, 2, 3), keepdim=True)
        padded = fill.expand(B, x.shape[1], H + 2 * p, W + 2 * p).clone()
        padded[:, :, p:p + H, p:p + W] = x
        dy = torch.randint(0, 2 * p + 1, (B,), generator=gen)
        dx = torch.randint(0, 2 * p + 1, (B,), generator=gen)
        rows = (dy[:, None] + torch.arange(H)[None]).to(x.device)  # (B, H)
        cols = (dx[:, None] + torch.arange(W)[None]).to(x.device)  # (B, W)
        b = torch.arange(B, device=x.device)[:, None, None]
        return padded.permute(0, 2, 3, 1)[b, rows[:, :, None], cols[:, None, :]].permute(0, 3, 1, 2).contiguous()

    def __repr__(self):
        return f"RandomShift(pixels={self.pixels})"


class GaussianNoise:
    """Add N(0, std^2) noise to every input value."""

    def __init__(self, std: float = 0.1):
        if std < 0:
            raise ValueError(f"std must be >= 0, got {std}")
        self.std = float(std)

    def __call__(self, x: torch.Tensor, gen: torch.Generator | None = None) -> torch.Tensor:
        noise = torch.randn(x.shape, generator=gen, dtype=x.dtype)
        return x + self.std * noise.to(x.device)

    def __repr__(self):
        return f"GaussianNoise(std={self.std})"


class Mixup:
    """Blend each input with another of the same batch, weights from Beta(alpha, alpha).

    Labels no longer describe the blends, so this is only for label-free objectives (the
    end-model distillation target of learned matching): `label_preserving` is False."""

    label_preserving = False

    def __init__(self, alpha: float = 1.0):
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not (math.isfinite(alpha) and alpha > 0):
            raise ValueError(f"alpha (Mixup's Beta concentration) must be a finite number > 0, got {alpha!r}")
        self.alpha = float(alpha)

    def __call__(self, x: torch.Tensor, gen: torch.Generator | None = None) -> torch.Tensor:
        if not x.is_floating_point():
            raise TypeError(f"Mixup blends real-valued inputs (images), got {x.dtype} (token ids cannot be blended)")
        B = x.shape[0]
        if self.alpha >= 1:
            a = torch.tensor(self.alpha, dtype=torch.float64)
            g1 = torch._standard_gamma(a.expand(B), generator=gen)
            g2 = torch._standard_gamma(a.expand(B), generator=gen)
            w = g1 / (g1 + g2)
        else:  # Beta(alpha, alpha) draws that do not underflow to 0 / 0 (numerics.dirichlet_weights)
            w = dirichlet_weights(B, 2, self.alpha, gen)[:, 0]
        w = w.to(device=x.device, dtype=x.dtype).reshape(B, *([1] * (x.dim() - 1)))
        partner = torch.randperm(B, generator=gen).to(x.device)
        return w * x + (1 - w) * x[partner]

    def __repr__(self):
        return f"Mixup(alpha={self.alpha})"


class Compose:
    def __init__(self, *augs):
        self.augs = augs
        self.label_preserving = all(getattr(a, "label_preserving", True) for a in augs)

    def __call__(self, x, gen=None):
        for a in self.augs:
            x = a(x, gen)
        return x

    def __repr__(self):
        return "Compose(" + ", ".join(map(repr, self.augs)) + ")"
