"""The loss landscape on the plane through three models, every grid point in one batched sweep.

    res = lf.plane([model_a, model_b, al.apply(model_b)], data, n=21)   # A, B and B aligned
    res["loss"][i][j]                                                   # at (x[j], y[i])

The plane's coordinates are orthonormal in parameter space (Garipov et al. 2018): origin theta_0,
e1 along theta_1 - theta_0, e2 along the part of theta_2 - theta_0 orthogonal to it (inner products
over every parameter of the swept space, float64). A point (x, y) is theta_0 + x e1 + y e2, which is
the 3-model mixture with weights (1 - b1 - b2, b1, b2), so the n x n grid (plus the three models)
is one `evaluate_mixtures` call: each batch is embedded once per model and the mixtures are planned
into passes by the engine's memory planning, as barrier and simplex sweeps are. JSON-ready.
"""
from __future__ import annotations

import math
import numbers
import time

import torch

from .barrier import public_engine
from .batches import reiterable
from .checks import spec_from_model
from .evaluate import EvalOptions, evaluate_mixtures
from .interpolate import models_params

#: Most grid points per side (n x n full evaluations; past this it is a typo).
MAX_SIDE = 201
#: Below this fraction of |theta_1 - theta_0|, theta_2 is taken to lie on the line of the other two.
COLLINEAR_TOLERANCE = 1e-6


def _check_side(n) -> int:
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or not 2 <= n <= MAX_SIDE:
        raise ValueError(f"n (grid points per side) must be an int in [2, {MAX_SIDE}], got {n!r}")
    return int(n)


def _check_margin(margin) -> float:
    if isinstance(margin, bool) or not isinstance(margin, numbers.Real) or not (math.isfinite(margin) and margin >= 0):
        raise ValueError(f"margin must be a finite number >= 0 (a fraction of the models' span), got {margin!r}")
    return float(margin)


def _dot(p: dict, q: dict) -> float:
    return math.fsum(float((p[k].double() * q[k].double()).sum()) for k in p)


def plane_basis(params: list) -> dict:
    """|u| (u = theta_1 - theta_0), the component c of w = theta_2 - theta_0 along u / |u|, and |v|
    (v = w - c u / |u|): the models sit at (0, 0), (|u|, 0) and (c, |v|)."""
    u = {k: params[1][k].double() - params[0][k].double() for k in params[0]}
    w = {k: params[2][k].double() - params[0][k].double() for k in params[0]}
    norm_u = math.sqrt(_dot(u, u))
    if norm_u == 0:
        raise ValueError("plane: models[0] and models[1] are the same point; the plane needs three distinct models")
    c = _dot(w, u) / norm_u
    v = {k: w[k] - (c / norm_u) * u[k] for k in w}  # formed, not |w|^2 - c^2: that cancels near collinear
    norm_v = math.sqrt(_dot(v, v))
    if norm_v <= COLLINEAR_TOLERANCE * norm_u:
        raise ValueError("plane: models[2] lies on the line through models[0] and models[1]; "
                         "the three models span no plane")
    return {"norm_u": norm_u, "c": c, "norm_v": norm_v}


def plane_weights(basis: dict, xs, ys) -> torch.Tensor:
    """(len(ys) * len(xs), 3) mixing weights of the points (x, y), row-major over y then x."""
    nu, c, nv = basis["norm_u"], basis["c"], basis["norm_v"]
    Y, X = torch.meshgrid(torch.as_tensor(ys, dtype=torch.float64), torch.as_tensor(xs, dtype=torch.float64),
                          indexing="ij")
    b2 = Y / nv
    b1 = X / nu - b2 * (c / nu)
    return torch.stack([1 - b1 - b2, b1, b2], dim=-1).reshape(-1, 3)


def plane(models, data, n: int = 21, *, margin: float = 0.2, space: str = "canonical", engine: str = "fused",
          max_batches: int | None = None, chunk: int = 32, max_tokens: int | None = None, progress: bool = False,
          max_memory: int | None = None) -> dict:
    """Loss and accuracy on an n x n grid over the plane through three models, and at the models.

    The grid covers the three models' coordinates widened by `margin` times their span on each side.
    Returns x (n), y (n), loss and acc (n rows of n, row i at y[i]), the models' coordinates, loss
    and acc, the basis (|u|, c, |v|), the space and the seconds taken."""
    if len(models) != 3:
        raise ValueError(f"plane needs exactly three models (e.g. A, B and B aligned onto A), got {len(models)}")
    n, margin = _check_side(n), _check_margin(margin)
    name = public_engine(engine)
    t0 = time.perf_counter()
    data = reiterable(data)
    arch, params = models_params(models, space)
    basis = plane_basis(params)
    corners = [(0.0, 0.0), (basis["norm_u"], 0.0), (basis["c"], basis["norm_v"])]
    lo_x, hi_x = min(p[0] for p in corners), max(p[0] for p in corners)
    lo_y, hi_y = 0.0, basis["norm_v"]
    pad_x, pad_y = margin * (hi_x - lo_x), margin * (hi_y - lo_y)
    xs = torch.linspace(lo_x - pad_x, hi_x + pad_x, n, dtype=torch.float64)
    ys = torch.linspace(lo_y - pad_y, hi_y + pad_y, n, dtype=torch.float64)
    weights = torch.cat([torch.eye(3, dtype=torch.float64), plane_weights(basis, xs, ys)])
    p0 = next(models[0].parameters())
    options = EvalOptions(engine=name, dtype=p0.dtype, device=p0.device, chunk=chunk, max_tokens=max_tokens,
                          max_batches=max_batches, input_spec=spec_from_model(models[0]), progress=progress,
                          desc="plane", fewer="a smaller n", max_memory=max_memory)
    res = evaluate_mixtures(arch, params, weights.tolist() if engine == "loop" else weights, data, options,
                            template=models[0])
    grid = res[3:]
    return {"x": xs.tolist(), "y": ys.tolist(),
            "loss": [[grid[i * n + j]["loss"] for j in range(n)] for i in range(n)],
            "acc": [[grid[i * n + j]["acc"] for j in range(n)] for i in range(n)],
            "models": [{"x": x, "y": y, "loss": r["loss"], "acc": r["acc"]} for (x, y), r in zip(corners, res[:3])],
            "basis": basis, "space": space, "margin": margin, "seconds": time.perf_counter() - t0}


__all__ = ["plane", "plane_basis", "plane_weights"]
