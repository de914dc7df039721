"""Sweeps over the simplex of several aligned models, with Dirichlet-sampled mixing weights."""
from __future__ import annotations

import time

import torch

from .batches import reiterable
from .engine import evaluate_mixtures_fused, evaluate_mixtures_loop
from .interpolate import models_params


def simplex(models, data, n: int = 16, alpha: float = 1.0, *, seed: int = 0, space: str = "canonical",
            engine: str = "fused", max_batches: int | None = None, chunk: int = 32,
            max_tokens: int | None = None) -> dict:
    """Evaluate the centroid, every model, and `n` Dirichlet(alpha) mixtures. "excess" is a
    point's loss minus the same mixture of the models' own losses; the worst sample is the
    one with the largest excess. JSON-ready."""
    if len(models) < 2:
        raise ValueError("simplex needs at least two models")
    t0 = time.perf_counter()
    data = reiterable(data)
    arch, params = models_params(models, space)
    N = len(models)
    # Dirichlet(alpha) = normalised Gamma(alpha) draws, from a private generator (seeded, no global state)
    gen = torch.Generator().manual_seed(seed)
    gamma = torch._standard_gamma(torch.full((n, N), float(alpha), dtype=torch.float64), generator=gen)
    samples = gamma / gamma.sum(-1, keepdim=True)
    weights = torch.cat([torch.eye(N, dtype=torch.float64), torch.full((1, N), 1.0 / N, dtype=torch.float64), samples])
    if engine == "loop":
        res = evaluate_mixtures_loop(models, params, weights.tolist(), data, max_batches)
    else:
        p0 = next(models[0].parameters())
        res = evaluate_mixtures_fused(arch, params, weights, data, max_batches=max_batches, dtype=p0.dtype,
                                      device=p0.device, chunk=chunk, max_tokens=max_tokens)
    own = torch.tensor([r["loss"] for r in res[:N]], dtype=torch.float64)
    own_acc = torch.tensor([r["acc"] for r in res[:N]], dtype=torch.float64)
    rows = []
    for w, r in zip(weights, res):
        rows.append({"weights": w.tolist(), "loss": r["loss"], "acc": r["acc"], "ece": r["ece"],
                     "excess": r["loss"] - float(w @ own), "acc_drop": float(w @ own_acc) - r["acc"]})
    sample_rows = rows[N + 1:]
    worst = max(sample_rows, key=lambda r: r["excess"]) if sample_rows else None
    return {"models": rows[:N], "centroid": rows[N], "samples": sample_rows, "worst": worst, "alpha": alpha,
            "space": space, "seconds": time.perf_counter() - t0}
