"""A plain, seedable training loop for every model `adapter_for` supports.

AdamW (decay on matrices only), linear warm-up then cosine decay to zero, optional label
smoothing and gradient clipping. Classification and language modelling share the code:
the loss is `task_loss(adapter.logits(model, x), y)`, which shifts LM targets itself.
"""
from __future__ import annotations

import math
import random
import time
from typing import Optional

import numpy as np
import torch

from .models.adapters import adapter_for
from .sweep.checks import check_batch, spec_from_model
from .sweep.metrics import evaluate, has_kept_targets, task_loss, task_of


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's global generators."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _as_batches(data, batch_size: Optional[int], shuffle: bool, seed: int):
    """A dataset (has `__getitem__` returning (x, y) and `subset`) becomes a Loader; iterables pass through."""
    from .data.loader import Loader

    if hasattr(data, "subset") and hasattr(data, "__getitem__") and not isinstance(data, Loader):
        return Loader(data, batch_size or 128, shuffle=shuffle, seed=seed, drop_last=False)
    if batch_size is not None and not isinstance(data, Loader):
        raise ValueError("batch_size= only applies when data is a dataset; this data is already batched")
    return data


def lr_at(step: int, total: int, lr: float, warmup_steps: int) -> float:
    """Linear warm-up over `warmup_steps`, then cosine decay to 0 at `total`."""
    if warmup_steps > 0 and step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    span = max(1, total - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / span)
    return lr * 0.5 * (1.0 + math.cos(math.pi * progress))


def _optimizer(model, lr: float, weight_decay: float):
    decay, no_decay = [], []
    for p in model.parameters():  # tied weights appear once
        if p.requires_grad:
            (decay if p.dim() >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=lr, betas=(0.9, 0.98), eps=1e-8)


def train(model, data, *, epochs: Optional[float] = None, steps: Optional[int] = None, lr: float = 1e-3,
          weight_decay: float = 0.05, warmup: float = 0.1, label_smoothing: float = 0.0, seed: int = 0,
          device=None, grad_clip: Optional[float] = 1.0, progress: bool = True, eval_data=None,
          batch_size: Optional[int] = None, augment=None) -> dict:
    """Train `model` in place on `data`; returns a JSON-ready history.

    data: a dataset (ImageDataset / TokenDataset: batched here with `batch_size`, default 128,
    shuffled from `seed`) or any re-iterable of `(inputs, targets)` batches (a `Loader` is
    re-seeded per epoch with `set_epoch`, so runs are reproducible). Give `epochs` or
    `steps` (neither: 1 epoch). `warmup` is a fraction of the total steps (>= 1: a step count). `seed` seeds
    torch/NumPy/Python and the shuffling. `eval_data` (dataset or batches) is evaluated at
    the end. `augment(x, generator) -> x` (e.g. `lmc_fast.data.augment.RandomShift`) transforms
    each training batch, drawing from a generator seeded with `seed`. Returns {"train_loss"
    (mean of the last epoch, or the last <=100 steps),
    "steps", "epochs", "seconds", "lr", "loss_curve" (mean loss per epoch / 100 steps),
    "eval" (metrics) when eval_data is given}.
    """
    from .data.loader import Loader

    if epochs is not None and steps is not None:
        raise ValueError("give epochs or steps, not both")
    if epochs is None and steps is None:
        epochs = 1
    seed_everything(seed)
    batches = _as_batches(data, batch_size, shuffle=True, seed=seed)
    if steps is None:
        try:
            per_epoch = len(batches)
        except TypeError:
            raise TypeError("epochs= needs data with a length (a dataset or Loader); pass steps= for other iterables") from None
        if per_epoch == 0:
            raise ValueError("data yields no batches")
        total = max(1, int(round(epochs * per_epoch)))
    else:
        total = int(steps)
        if total < 1:
            raise ValueError(f"steps must be >= 1, got {steps}")
    warmup_steps = int(round(warmup * total)) if warmup < 1 else int(warmup)

    adapter = adapter_for(model)
    spec, task = spec_from_model(model), task_of(adapter.arch(model))
    p0 = next(model.parameters())
    device = torch.device(device) if device is not None else p0.device
    model.to(device)
    dtype = p0.dtype
    opt = _optimizer(model, lr, weight_decay)
    aug_gen = torch.Generator().manual_seed(seed)

    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=total, desc="train", leave=False, dynamic_ncols=True)
    model.train()
    losses: list[float] = []
    curve: list[float] = []
    window = []
    window_len = len(batches) if steps is None else min(100, total)
    step, epoch = 0, 0
    t0 = time.perf_counter()
    try:
        while step < total:
            if isinstance(batches, Loader):
                batches.set_epoch(epoch)
            n_in_epoch = 0
            for x, y in batches:
                if step >= total:
                    break
                check_batch(spec, x, y)
                x = x.to(device=device, dtype=dtype) if x.is_floating_point() else x.to(device)
                y = y.to(device)
                if augment is not None:
                    x = augment(x, aug_gen)
                cur_lr = lr_at(step, total, lr, warmup_steps)
                for g in opt.param_groups:
                    g["lr"] = cur_lr
                logits = adapter.logits(model, x)
                loss = task_loss(logits, y, label_smoothing, task)  # -100 targets are skipped
                if not torch.isfinite(loss):
                    raise FloatingPointError(f"loss became {loss.item()} at step {step} (lower lr?)")
                value = loss.item()
                if has_kept_targets(logits, y, task):
                    # a batch whose every target is -100 counts as a step but moves nothing
                    # (AdamW would still move the weights: momentum and decay) and no loss
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    if grad_clip:
                        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
                    opt.step()
                    losses.append(value)
                    window.append(value)
                if len(window) == window_len:
                    curve.append(sum(window) / len(window))
                    window = []
                step += 1
                n_in_epoch += 1
                if bar is not None:
                    bar.update(1)
                    if step % 10 == 0 or step == total:
                        bar.set_postfix(loss=f"{value:.4f}", lr=f"{cur_lr:.2e}")
            if n_in_epoch == 0:
                raise ValueError("data yields no batches")
            epoch += 1
    finally:
        if bar is not None:
            bar.close()
    seconds = time.perf_counter() - t0
    if not losses:
        raise ValueError(f"no data: every target of the {step} training batch(es) is the ignore index -100")
    tail = losses[-window_len:]
    history = {
        "train_loss": float(sum(tail) / len(tail)),
        "steps": step,
        "epochs": step / len(batches) if hasattr(batches, "__len__") else None,
        "seconds": seconds,
        "lr": lr,
        "seed": seed,
        "loss_curve": curve,
    }
    if eval_data is not None:
        eval_batches = Loader(eval_data, 512) if hasattr(eval_data, "subset") else eval_data
        history["eval"] = evaluate(model, eval_batches, device=device)
    return history
