"""Cheap per-batch checks of what a model is fed, and the memory estimate of a fused sweep.

Every engine (the per-point loop, the batched-GEMM engine, the Triton kernel path), training
and learned matching refuse a batch the model cannot take with one line naming the bad value,
instead of a traceback from deep inside an embedding or a GEMM; worse, the fused engine
indexes a stacked embedding table, where a token id of -1 silently reads the last row.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch

from ..models.functional import embedding_names
from ..numerics import all_finite

#: Hugging Face's "ignore this position" label: excluded from the loss and every metric.
IGNORE_INDEX = -100


def as_real(value) -> float:
    """float(value) for a real number (Python, NumPy or a 0-d torch scalar); NaN for anything
    else (bools and strings included), so one `isfinite` test refuses every bad value."""
    if isinstance(value, (bool, str, bytes)):
        return math.nan
    try:
        return float(value)
    except (TypeError, ValueError, RuntimeError):
        return math.nan


@dataclass(frozen=True)
class InputSpec:
    """What batches a model takes: token ids or images, its output size (classes or vocabulary)
    and, for language models, its context (None: not known, e.g. rotary positions given as
    parameters); for images either the exact image shape (known from a config) or the patch
    features and patch count (all that stacked parameters tell)."""

    inputs: str  # "tokens" | "patches"
    n_out: int
    vocab: int | None = None
    block_size: int | None = None
    image_shape: tuple[int, int, int] | None = None
    patch_features: int | None = None
    n_patches: int | None = None
    reserved_token: int | None = None  # a token id the inputs must not hold (RoBERTa's padding id)
    # DiT: inputs carry a timestep and a class plane after the image (image_shape counts them), n_out is the
    # class count (the class n_out is the null class), targets are the noise
    denoise: bool = False


def spec_from_params(arch, params: dict) -> InputSpec:
    """The spec of a model given as standard parameters (leading K axes are allowed)."""
    n_out = params[arch.head_name + ".weight"].shape[-2]
    pos = params["pos_embed"].shape[-2] if "pos_embed" in params else None
    if arch.conditioned:
        return InputSpec("patches", params["y_embed.weight"].shape[-2] - 1,
                         patch_features=params["patch_embed.weight"].shape[-1], n_patches=pos, denoise=True)
    if arch.inputs == "tokens":
        block = None if pos is None else pos - arch.position_offset
        return InputSpec("tokens", n_out, vocab=params["tok_embed.weight"].shape[-2], block_size=block,
                         reserved_token=arch.reserved_token)
    return InputSpec("patches", n_out, patch_features=params["patch_embed.weight"].shape[-1], n_patches=pos - 1)


def _square(size) -> tuple[int, int]:
    return (size, size) if isinstance(size, int) else tuple(size)


def spec_from_model(model) -> InputSpec:
    """The spec of a model object, read from its config (reference or Hugging Face)."""
    from ..models.adapters import adapter_for

    adapter = adapter_for(model)
    arch, c = adapter.arch(model), model.config
    if arch.conditioned:  # the reference DiT's and diffusers' configs name the sizes differently: the adapter's names
        s = adapter.shape_fields(model)
        return InputSpec("patches", s["num_classes"], image_shape=(s["channels"] + 2, *_square(s["image_size"])),
                         denoise=True)
    if arch.inputs == "tokens":
        block = adapter.shape_fields(model)["context"]
        n_out = adapter.shape_fields(model).get("num_classes", c.vocab_size)  # sequence classifiers
        return InputSpec("tokens", n_out, vocab=c.vocab_size, block_size=block, reserved_token=arch.reserved_token)
    channels = getattr(c, "channels", None) or c.num_channels
    n_out = getattr(c, "num_classes", None) or c.num_labels
    return InputSpec("patches", n_out, image_shape=(channels, *_square(c.image_size)))


def _range(t: torch.Tensor) -> tuple[int, int]:
    lo, hi = torch.aminmax(t)
    return int(lo), int(hi)


def _vit_shapes(patch_features: int, n_patches: int, prefer_channels: int) -> list[tuple[int, int, int]]:
    """Square (C, H, W) images that stacked ViT parameters can take, the input's channel
    count first, then 3 and 1 (for the error message)."""
    side = math.isqrt(n_patches)
    shapes = []
    for c in range(1, patch_features + 1):
        p = math.isqrt(patch_features // c)
        if patch_features % c == 0 and p * p * c == patch_features and side * side == n_patches:
            shapes.append((c, p * side, p * side))
    rank = {prefer_channels: 0, 3: 1, 1: 2}
    return sorted(shapes, key=lambda s: rank.get(s[0], 3))[:3]


def _fits_patches(spec: InputSpec, shape) -> bool:
    """Whether (C, H, W) cuts into the model's patches: what the functional embedding needs."""
    C, H, W = shape
    if spec.patch_features % C:
        return False
    p = math.isqrt(spec.patch_features // C)
    return p * p * C == spec.patch_features and H % p == 0 and W % p == 0 and (H // p) * (W // p) == spec.n_patches


def check_images(spec: InputSpec, x: torch.Tensor) -> None:
    if not x.is_floating_point():
        raise ValueError(f"images must be a floating-point tensor, got {x.dtype}")
    if not all_finite(x):
        bad = int((~torch.isfinite(x)).sum())
        raise ValueError(f"images hold {bad} NaN or infinite value(s); every pixel must be finite")
    if x.dim() == 4 and (x.shape[1:] == spec.image_shape if spec.image_shape else _fits_patches(spec, x.shape[1:])):
        return
    wanted = [spec.image_shape] if spec.image_shape else _vit_shapes(spec.patch_features, spec.n_patches,
                                                                     x.shape[1] if x.dim() == 4 else 3)
    takes = " or ".join(f"(B, {c}, {h}, {w})" for c, h, w in wanted) or "images of a different shape"
    raise ValueError(f"images of shape {tuple(x.shape)} do not fit the model, which takes {takes}")


def check_token_ids(spec: InputSpec, x: torch.Tensor) -> None:
    if x.dim() != 2 or x.is_floating_point() or x.is_complex() or x.dtype == torch.bool:
        raise ValueError(f"token ids must be a (B, T) integer tensor, got shape {tuple(x.shape)} and {x.dtype}")
    if spec.block_size is not None and x.shape[1] > spec.block_size:
        raise ValueError(f"sequence length {x.shape[1]} exceeds the model's context of {spec.block_size} positions")
    if x.numel():
        lo, hi = _range(x)
        bad = lo if lo < 0 else hi
        if lo < 0 or hi >= spec.vocab:
            raise ValueError(f"token id {bad} is outside the vocabulary [0, {spec.vocab}) (vocab_size={spec.vocab})")
        if spec.reserved_token is not None and bool((x == spec.reserved_token).any()):
            raise ValueError(f"token id {spec.reserved_token} is the model's padding id, whose positions it computes "
                             "apart (RoBERTa): inputs must not hold it")


def check_targets(spec: InputSpec, y: torch.Tensor) -> None:
    """Targets are class / token ids in [0, n_out), or IGNORE_INDEX (-100) for positions to skip."""
    if y.is_floating_point() or y.is_complex() or y.dtype == torch.bool:
        raise ValueError(f"targets must be integer class or token ids, got {y.dtype}")
    if not y.numel():
        return
    lo, hi = _range(y)
    if lo < 0:  # only the ignore index may be negative: look again without it
        kept = y[y != IGNORE_INDEX]
        if not kept.numel():
            return
        lo, hi = _range(kept)
    if lo < 0 or hi >= spec.n_out:
        what = "token id" if spec.inputs == "tokens" else "class label"
        raise ValueError(f"target {what} {lo if lo < 0 else hi} is outside [0, {spec.n_out}) "
                         f"(and is not the ignore index {IGNORE_INDEX})")


def check_denoising(spec: InputSpec, x: torch.Tensor, y: torch.Tensor) -> None:
    """A DiT batch: packed inputs (B, C + 2, H, W) whose last two planes are constant, whole timesteps in
    [0, MAX_TIMESTEPS) and classes in [0, n_out] (n_out: the null class), and finite noise (B, C, H, W)."""
    from ..models.functional_dit import MAX_TIMESTEPS

    if not x.is_floating_point() or x.dim() != 4 or x.shape[1] < 3:
        raise ValueError(f"DiT inputs must be packed (B, C + 2, H, W) floats (the image, then timestep and class "
                         f"planes, as lmc_fast.diffusion.DenoisingBatches makes them; the CLI's --data has no "
                         f"denoising batches yet), got shape {tuple(x.shape)} and {x.dtype}")
    fits = (tuple(x.shape[1:]) == tuple(spec.image_shape) if spec.image_shape else
            _fits_patches(spec, (x.shape[1] - 2, *x.shape[2:])))
    image = spec.image_shape
    if not fits:
        raise ValueError(f"DiT inputs of shape {tuple(x.shape)} do not fit the model"
                         + (f", which takes (B, {image[0]}, {image[1]}, {image[2]})" if spec.image_shape else ""))
    if not all_finite(x):
        raise ValueError("DiT inputs hold NaN or infinite values")
    for plane, what, hi in ((x[:, -2], "timestep", MAX_TIMESTEPS - 1), (x[:, -1], "class", spec.n_out)):
        first = plane[:, :1, :1]
        if bool((plane != first).any()) or bool((first != first.round()).any()):
            raise ValueError(f"DiT inputs' {what} plane is not one whole number per sample")
        if x.shape[0] and not (0 <= float(first.min()) and float(first.max()) <= hi):
            raise ValueError(f"DiT {what} {float(first.min() if first.min() < 0 else first.max()):g} is outside "
                             f"[0, {hi}]")
    if not y.is_floating_point() or tuple(y.shape) != (x.shape[0], x.shape[1] - 2, *x.shape[2:]):
        raise ValueError(f"DiT targets must be the noise, floats of shape {(x.shape[0], x.shape[1] - 2, *x.shape[2:])}, "
                         f"got {tuple(y.shape)} and {y.dtype}")
    if not all_finite(y):
        raise ValueError("DiT targets (the noise) hold NaN or infinite values")


def check_batch(spec: InputSpec, x: torch.Tensor, y: torch.Tensor) -> None:
    """One line naming what is wrong with a batch (inputs, then targets), or nothing."""
    if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
        raise ValueError(f"a batch must be two tensors (inputs, targets), got {type(x).__name__} and {type(y).__name__}")
    if spec.denoise:
        return check_denoising(spec, x, y)
    if spec.inputs == "tokens":
        check_token_ids(spec, x)
    else:
        check_images(spec, x)
    check_targets(spec, y)


# ---------------------------------------------------------------- sweep memory


def available_memory_bytes(device) -> int | None:
    """Free memory on `device` (CUDA: the driver's free bytes; CPU: MemAvailable, capped by a
    cgroup v2 limit when the process runs in one), or None when it cannot be told."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    if device.type != "cpu":
        return None
    free = _meminfo_available()
    limit = _cgroup_headroom()
    candidates = [v for v in (free, limit) if v is not None]
    return min(candidates) if candidates else None


def _meminfo_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _cgroup_headroom() -> int | None:
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        with open("/sys/fs/cgroup/memory.current") as f:
            used = int(f.read().strip())
    except (OSError, ValueError):
        return None
    return None if limit == "max" else max(0, int(limit) - used)


def format_gb(n_bytes: float) -> str:
    return f"{n_bytes / 1e9:.3g} GB"


def fused_sweep_bytes(arch, params: dict, K: int, N: int, dtype, max_tokens: int, stacked: bool = True,
                      device="cpu") -> int:
    """About the peak bytes of the batched-GEMM engine for K mixtures of N models:
    the K stacked mixed parameter sets (`stacked`; the kernel path stacks none), the float64
    scratch of mixing the largest tensor, the N end models' embedding tables, and the
    activations of one pass of `max_tokens` tokens (at least one sequence). The attention
    scores count except on CUDA below float64, where scaled_dot_product_attention's fused
    kernels (flash / memory-efficient, masks included) keep them on chip."""
    item = torch.empty((), dtype=dtype).element_size()
    n_params = sum(t.numel() for t in params.values())
    largest = max(t.numel() for t in params.values())
    spec = spec_from_params(arch, params)
    # a rotary model's context is not in its parameters: assume sequences of max_tokens (one per pass)
    seq = (spec.block_size or max_tokens) if spec.inputs == "tokens" else spec.n_patches + 1
    tokens = max(max_tokens, seq)
    logits_per_token = spec.n_out if spec.inputs == "tokens" else -(-spec.n_out // seq)
    # residual, normed input, q, k, v, attention output + MLP hidden (and its activation) +
    # one row of attention scores per head; logits in the run dtype, then float64 metrics
    fused_attention = torch.device(device).type == "cuda" and dtype != torch.float64
    scores = 0 if fused_attention else arch.n_head * seq
    per_token = item * (6 * arch.d_model + 2 * arch.d_mlp + scores) + logits_per_token * (item + 3 * 8)
    embed = sum(params[k].numel() for k in embedding_names(arch))
    total = N * embed * item + tokens * per_token
    if stacked:
        total += K * n_params * item + 3 * K * largest * 8
    return int(total)


def check_max_memory(max_memory) -> int | None:
    if max_memory is not None and (isinstance(max_memory, bool) or not isinstance(max_memory, int) or max_memory < 1):
        raise ValueError(f"max_memory must be a number of bytes >= 1 (or None: the device's free memory), "
                         f"got {max_memory!r}")
    return max_memory


def memory_limit(device, max_memory: int | None = None) -> int | None:
    """The bytes a sweep may use: `max_memory`, else the device's free memory (None: unknown)."""
    return available_memory_bytes(device) if check_max_memory(max_memory) is None else max_memory


def fitted_token_budget(arch, params: dict, N: int, dtype, device, budget: int, *, max_memory: int | None = None,
                        stacked: bool = True) -> int:
    """The device's default token budget, halved until one mixture's pass fits in memory (a
    model with a large vocabulary holds ~1 MB of logits and metrics per token: 262k tokens would
    not fit on any GPU). Only for a default: a max_tokens the user chose is kept, and refused if
    it does not fit. At least 1 (a pass then holds one sequence: the plan refuses what still does
    not fit)."""
    free = memory_limit(device, max_memory)
    if free is None:
        return budget
    while budget > 1 and fused_sweep_bytes(arch, params, 1, N, dtype, budget, stacked, device) > free:
        budget //= 2
    return budget


def plan_mixture_blocks(arch, params: dict, K: int, N: int, dtype, device, max_tokens: int, *,
                        max_memory: int | None = None) -> tuple[int, int]:
    """(mixtures per block, planned peak bytes) for the batched engine: all K mixtures at once
    when they fit in `memory_limit`, else as many as fit beside one pass (their stacked
    parameters grow with the block; the pass and the end models' embeddings do not). Refuses,
    before anything is allocated, only a sweep of which even one mixture does not fit."""
    need = fused_sweep_bytes(arch, params, K, N, dtype, max_tokens, device=device)
    free = memory_limit(device, max_memory)
    if free is None or need <= free:
        return K, need
    fixed = fused_sweep_bytes(arch, params, 0, N, dtype, max_tokens, device=device)
    per_mixture = fused_sweep_bytes(arch, params, 1, N, dtype, max_tokens, device=device) - fixed
    block = (free - fixed) // per_mixture
    if block < 1:
        _refuse(fixed + per_mixture, free, 1, N, dtype, max_tokens, "a smaller --max-tokens (even one mixture "
                "does not fit)")
    return int(block), int(fixed + block * per_mixture)


def _refuse(need: int, free: int, K: int, N: int, dtype, max_tokens: int, advice: str):
    raise ValueError(f"sweep needs about {format_gb(need)} (K={K} mixtures of {N} models, max_tokens={max_tokens}, "
                     f"{str(dtype).replace('torch.', '')}) but only {format_gb(free)} is available; use {advice}")


def check_sweep_memory(arch, params: dict, K: int, N: int, dtype, device, max_tokens: int, *,
                       stacked: bool = True, fewer: str = "fewer lambdas", max_memory: int | None = None) -> int:
    """Refuse, before anything is allocated, a fused sweep that would not fit in memory; else its planned bytes."""
    need = fused_sweep_bytes(arch, params, K, N, dtype, max_tokens, stacked, device)
    free = memory_limit(device, max_memory)
    if free is not None and need > free:
        _refuse(need, free, K, N, dtype, max_tokens, f"{fewer} or a smaller --max-tokens")
    return need
