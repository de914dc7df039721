"""Sweeps over the simplex of several aligned models, with Dirichlet-sampled mixing weights."""
from __future__ import annotations

import math
import numbers
import time

import torch

from ..numerics import dirichlet_weights
from .barrier import public_engine
from .batches import reiterable
from .checks import as_real, spec_from_model
from .evaluate import EvalOptions, evaluate_mixtures
from .interpolate import models_params

#: Most Dirichlet samples one sweep draws (each is a full evaluation; past this it is a typo).
MAX_SAMPLES = 100_000


def check_alpha(alpha) -> float:
    """A Dirichlet concentration: a finite number > 0 (alpha <= 0 is no distribution; the
    Gamma sampler would quietly return garbage, e.g. [0.5, 0.5] for every sample)."""
    value = as_real(alpha)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"alpha (the Dirichlet concentration) must be a finite number > 0, got {alpha!r}")
    return value


def check_samples(n) -> int:
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or not 1 <= n <= MAX_SAMPLES:
        raise ValueError(f"n (the number of Dirichlet samples) must be an int in [1, {MAX_SAMPLES}], got {n!r}")
    return int(n)


def dirichlet(n: int, n_models: int, alpha: float, seed: int) -> torch.Tensor:
    """(n, n_models) Dirichlet(alpha) draws: normalised Gamma(alpha) draws from a private,
    seeded generator (no global state)."""
    return dirichlet_weights(n, n_models, alpha, torch.Generator().manual_seed(seed))


def simplex(models, data, n: int = 16, alpha: float = 1.0, *, seed: int = 0, space: str = "canonical",
            engine: str = "fused", max_batches: int | None = None, chunk: int = 32,
            max_tokens: int | None = None, progress: bool = False, distributed: bool | None = None,
            max_memory: int | None = None, checkpoint=None, checkpoint_every: int = 16) -> dict:
    """Evaluate the centroid, every model, and `n` Dirichlet(alpha) mixtures. "excess" is a
    point's loss minus the same mixture of the models' own losses; the worst sample is the
    one with the largest excess. `progress=True` shows a bar over points (loop engine) or
    batches (fused engine). `distributed`: as in `barrier` (the fused engine shards the batches
    across an initialised group's ranks and all-reduces the sums); `max_memory` as in `barrier`;
    `checkpoint` / `checkpoint_every` as in `barrier` (a folder the sweep records its progress in
    and resumes from). JSON-ready."""
    if len(models) < 2:
        raise ValueError("simplex needs at least two models")
    alpha, n = check_alpha(alpha), check_samples(n)
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise ValueError(f"seed must be a whole number, got {seed!r}")
    name = public_engine(engine)
    t0 = time.perf_counter()
    data = reiterable(data)
    arch, params = models_params(models, space)
    N = len(models)
    eye, centroid = torch.eye(N, dtype=torch.float64), torch.full((1, N), 1.0 / N, dtype=torch.float64)
    weights = torch.cat([eye, centroid, dirichlet(n, N, alpha, seed)])
    p0 = next(models[0].parameters())
    options = EvalOptions(engine=name, dtype=p0.dtype, device=p0.device, chunk=chunk, max_tokens=max_tokens,
                          max_batches=max_batches, input_spec=spec_from_model(models[0]),
                          distributed=distributed if engine == "fused" else False, progress=progress,
                          desc="simplex", fewer="fewer samples", max_memory=max_memory, checkpoint=checkpoint,
                          checkpoint_every=checkpoint_every)
    # the per-point engine takes the weights as lists (the loop's own float64 arithmetic)
    res = evaluate_mixtures(arch, params, weights.tolist() if engine == "loop" else weights, data, options,
                            template=models[0])
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
