"""Evaluate K mixtures sum_n w_kn theta_n of N models: the hot path of every sweep.

- `evaluate_mixtures_loop`: the per-point baseline (mix, load into a model, evaluate);
- `evaluate_mixtures_fused`: every point in one pass per batch: mixed parameters stacked
  along a leading K axis, batched GEMMs, and the embedding (linear in the parameters)
  computed once per model and mixed, instead of once per point.
Unit of work = (block of mixtures, data shard), so sharding across processes drops in.
"""
from __future__ import annotations

import torch

from ..models.adapters import adapter_for
from . import functional as Fn
from .batches import limited
from .interpolate import mix
from .metrics import MetricSums, evaluate


def mix_params(params_list, weights: torch.Tensor, dtype, device) -> dict:
    """{name: (K, ...)} = sum_n weights[k, n] * params_list[n][name], accumulated in float64
    tensor by tensor (no stacked copy of every model), then cast once."""
    W = torch.as_tensor(weights, dtype=torch.float64)
    out = {}
    for name in params_list[0]:
        acc = None
        for n, p in enumerate(params_list):
            t = p[name].to(torch.float64)
            term = W[:, n].reshape(-1, *([1] * t.dim())) * t
            acc = term if acc is None else acc + term
        out[name] = acc.to(device=device, dtype=dtype)
    return out


def evaluate_mixtures_loop(models, params_list, weights, data, max_batches=None, progress=None) -> list[dict]:
    adapter, template = adapter_for(models[0]), models[0]
    out = []
    for w in weights:
        model = adapter.build(template, mix(params_list, w))
        out.append(evaluate(model, limited(data, max_batches)))
        if progress is not None:
            progress.update(1)
    return out


@torch.no_grad()
def evaluate_mixtures_fused(arch, params_list, weights, data, *, max_batches=None, progress=None,
                            dtype=torch.float32, device="cpu", chunk: int = 32) -> list[dict]:
    W = torch.as_tensor(weights, dtype=torch.float64)
    K, N = W.shape
    ends = Fn.stack([{k: v.to(device=device, dtype=dtype) for k, v in p.items()} for p in params_list])
    blocks = [list(range(i, min(i + chunk, K))) for i in range(0, K, chunk)]
    # mixing in float64 per tensor, then one cast: the same parameters the loop loads
    mixed = [mix_params(params_list, W[idx], dtype, device) for idx in blocks]
    Wd = W.to(device=device, dtype=dtype)
    sums = [None] * K
    for x, y in limited(data, max_batches):
        x = x.to(device=device, dtype=dtype) if x.is_floating_point() else x.to(device)
        y = y.to(device)
        e = Fn.embed(arch, ends, x)  # (N, B, T, d)
        for idx, p in zip(blocks, mixed):
            h = torch.einsum("kn,n...->k...", Wd[idx], e)
            accumulate(sums, idx, Fn.head(arch, p, Fn.blocks(arch, p, h)), y)
        if progress is not None:
            progress.update(1)
    return results(sums)


def accumulate(sums: list, idx: list[int], logits: torch.Tensor, targets: torch.Tensor):
    """Add a (len(idx), B, ...) block of logits to the running metrics of mixtures idx."""
    for j, i in enumerate(idx):
        if sums[i] is None:
            sums[i] = MetricSums(is_lm=logits.dim() == 4)
        sums[i].add(logits[j], targets)


def results(sums: list) -> list[dict]:
    if sums[0] is None:
        raise ValueError("no data: the evaluation iterable yielded no batches")
    return [s.result() for s in sums]
