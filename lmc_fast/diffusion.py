"""The diffusion task of DiT: DDPM's noise schedule, evaluation batches with fixed draws, training, sampling.

- `Schedule`: DDPM's linear betas over 1,000 steps (DiT's); x_t = sqrt(abar_t) x_0 + sqrt(1 - abar_t) eps.
- `DenoisingBatches`: (packed inputs, noise) batches of a labelled image set with the timestep and the
  noise drawn once per batch from a seed, so every pass yields the same batches and barriers are
  deterministic (the task "denoise" of sweep/metrics.py scores the predicted noise by its mean squared error).
- `train_dit`: noise-prediction training with classifier-free-guidance dropout of the class (DiT's 10%).
- `sample`: deterministic DDIM (eta = 0): the same starting noise and classes give the same pictures, so
  images along an interpolation path differ only by the model.
- `images_8x8`: digits and Fashion-MNIST brought to the same 8x8 size, scaled to [-1, 1].
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .models.functional_dit import MAX_TIMESTEPS, pack_inputs


class Schedule:
    """DDPM's linear beta schedule: betas from 1e-4 to 0.02 over MAX_TIMESTEPS steps (float64)."""

    def __init__(self, steps: int = MAX_TIMESTEPS, beta_start: float = 1e-4, beta_end: float = 0.02):
        self.steps = steps
        betas = torch.linspace(beta_start, beta_end, steps, dtype=torch.float64)
        self.alpha_bar = torch.cumprod(1 - betas, dim=0)

    def noised(self, x0: torch.Tensor, t: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
        ab = self.alpha_bar.to(x0.device)[t].to(x0.dtype).reshape(-1, *([1] * (x0.dim() - 1)))
        return ab.sqrt() * x0 + (1 - ab).sqrt() * eps


def images_8x8(name: str, split: str = "train", limit: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(images (N, 1, 8, 8) in [-1, 1], labels (N,)) of "digits" (scikit-learn's) or "fashion" (Fashion-MNIST,
    28x28 area-averaged to 8x8), the same size so that one DiT shape takes both."""
    from .data.images import load_digits, load_fashion_mnist

    if name == "digits":
        ds = load_digits(split, normalize=False)
        x = ds.x
    elif name == "fashion":
        ds = load_fashion_mnist(split, normalize=False, limit=limit)
        x = F.adaptive_avg_pool2d(ds.x, 8)
    else:
        raise ValueError(f"images_8x8 takes 'digits' or 'fashion', got {name!r}")
    x, y = x * 2 - 1, ds.y
    return (x[:limit], y[:limit]) if limit is not None else (x, y)


class DenoisingBatches:
    """Re-iterable (inputs, noise) batches of `images` with labels: per batch i the timesteps (uniform over
    the schedule) and the noise are drawn from seed + i, the same on every pass."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, batch_size: int = 256, seed: int = 0,
                 schedule: Schedule | None = None):
        if images.dim() != 4 or labels.shape != images.shape[:1]:
            raise ValueError(f"DenoisingBatches needs images (N, C, H, W) and labels (N,), got {tuple(images.shape)} "
                             f"and {tuple(labels.shape)}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.images, self.labels, self.batch_size, self.seed = images, labels, batch_size, seed
        self.schedule = schedule or Schedule()

    def __len__(self) -> int:
        return math.ceil(len(self.images) / self.batch_size)

    def __iter__(self):
        for i in range(len(self)):
            x0 = self.images[i * self.batch_size:(i + 1) * self.batch_size]
            y = self.labels[i * self.batch_size:(i + 1) * self.batch_size]
            g = torch.Generator().manual_seed(self.seed + i)
            t = torch.randint(0, self.schedule.steps, (len(x0),), generator=g)
            eps = torch.randn(x0.shape, generator=g, dtype=torch.float64).to(x0.dtype)
            yield pack_inputs(self.schedule.noised(x0, t, eps), t, y), eps


def train_dit(model, images: torch.Tensor, labels: torch.Tensor, *, steps: int = 2000, batch_size: int = 128,
              lr: float = 1e-3, seed: int = 0, class_dropout: float = 0.1, warmup: int = 100,
              log_every: int = 0) -> list[float]:
    """Noise-prediction training (AdamW, linear warm-up then cosine decay), the class replaced by the null class
    with probability `class_dropout`; the data order, timesteps and noise all come from `seed`. Returns the
    loss of every step."""
    from .models.dit import DiT

    if not isinstance(model, DiT):
        raise ValueError(f"train_dit trains lmc_fast.models.DiT, got {type(model).__name__}")
    sched, null = Schedule(), model.config.num_classes
    g = torch.Generator().manual_seed(seed)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    lr_at = lambda s: lr * min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * s / steps))  # noqa: E731
    losses = []
    model.train()
    for step in range(steps):
        idx = torch.randint(0, len(images), (batch_size,), generator=g)
        x0, y = images[idx], labels[idx].clone()
        y[torch.rand(batch_size, generator=g) < class_dropout] = null
        t = torch.randint(0, sched.steps, (batch_size,), generator=g)
        eps = torch.randn(x0.shape, generator=g)
        loss = F.mse_loss(model.predict_noise(sched.noised(x0, t, eps), t, y), eps)
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if log_every and (step + 1) % log_every == 0:
            print(f"step {step + 1}/{steps} loss {sum(losses[-log_every:]) / log_every:.4f}", flush=True)
    model.eval()
    return losses


@torch.no_grad()
def sample(model, labels: torch.Tensor, *, steps: int = 50, seed: int = 0, guidance: float = 1.0,
           noise: torch.Tensor | None = None, clip: bool = True) -> torch.Tensor:
    """Deterministic DDIM samples (B, C, H, W) of the classes `labels` from `noise` (or N(0, 1) drawn from
    `seed`); `guidance` > 1 mixes in the null class's prediction (classifier-free guidance); `clip` keeps each
    step's estimate of x_0 in the data's range [-1, 1] (pixel-space DDPM's usual choice)."""
    c = model.config
    sched = Schedule()
    if noise is None:
        noise = torch.randn(len(labels), c.channels, c.image_size, c.image_size,
                            generator=torch.Generator().manual_seed(seed))
    x = noise.to(next(model.parameters()).dtype)
    ts = torch.linspace(sched.steps - 1, 0, steps).round().long()
    null = torch.full_like(labels, c.num_classes)
    for i, t in enumerate(ts):
        tt = torch.full((len(x),), int(t))
        eps = model.predict_noise(x, tt, labels)
        if guidance != 1.0:
            eps = model.predict_noise(x, tt, null) + guidance * (eps - model.predict_noise(x, tt, null))
        ab = sched.alpha_bar[t].to(x.dtype)
        ab_prev = sched.alpha_bar[ts[i + 1]].to(x.dtype) if i + 1 < len(ts) else torch.ones((), dtype=x.dtype)
        x0 = (x - (1 - ab).sqrt() * eps) / ab.sqrt()
        if clip:  # then the noise that x_0 and x_t imply, so the step stays on the DDIM path
            x0 = x0.clamp(-1, 1)
            eps = (x - ab.sqrt() * x0) / (1 - ab).sqrt()
        x = ab_prev.sqrt() * x0 + (1 - ab_prev).sqrt() * eps
    return x
