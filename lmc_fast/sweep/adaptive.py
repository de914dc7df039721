"""Adaptive lambdas: a coarse grid, then refinement at the barrier's peak until it stops rising.

    res = lf.barrier(a, b, data, lambdas="adaptive")             # Adaptive(): tol 1e-3, at most 25 points
    res = lf.barrier(a, b, data, lambdas=Adaptive(tol=1e-4))
    res.adaptive                                                  # {"evaluations": 11, "rounds": 6, ...}

The signed curve s(lam) = L(theta_lam) - chord is measured on `start` evenly spaced points; each
round then evaluates one point where the peak is: the vertex of the parabola through the highest
interior point and its two neighbours when it falls strictly inside their interval (and not on a
point already measured), else the midpoint of the wider side. It stops when a round raises the
measured maximum by less than `tol` (loss units) and the parabola's predicted peak is within `tol`
of it, when the bracket around the peak is narrower than `min_width`, or after `max_evaluations`
points. The barrier reported is the largest measured value: a lower bound that a smooth peak
approaches within tol. `peak_resolved` speaks of the peak the coarse grid found: a spike narrower
than its spacing (set by `start`) can be missed, as by any grid of that spacing. At 7B every point
is minutes of compute; the grid's 25 cost 25 of them.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass


@dataclass(frozen=True)
class Adaptive:
    tol: float = 1e-3  # loss units: stop once a round raises the peak (and its parabola) by less
    start: int = 5  # evenly spaced points of the coarse grid, both ends included
    max_evaluations: int = 25  # never more points than the default grid
    min_width: float = 1e-3  # the bracket around the peak is resolved below this

    def check(self) -> "Adaptive":
        if not (isinstance(self.tol, numbers.Real) and not isinstance(self.tol, bool)
                and math.isfinite(self.tol) and self.tol > 0):
            raise ValueError(f"Adaptive.tol must be a finite number > 0, got {self.tol!r}")
        for name, low in (("start", 3), ("max_evaluations", 3)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or not low <= v <= 10_001:
                raise ValueError(f"Adaptive.{name} must be an int in [{low}, 10001], got {v!r}")
        if self.max_evaluations < self.start:
            raise ValueError(f"Adaptive.max_evaluations ({self.max_evaluations}) is below start ({self.start})")
        if not (isinstance(self.min_width, numbers.Real) and 0 < self.min_width < 1):
            raise ValueError(f"Adaptive.min_width must be a number in (0, 1), got {self.min_width!r}")
        return self


def as_adaptive(lambdas) -> Adaptive | None:
    """Adaptive settings for `lambdas` ("adaptive" or an Adaptive), None for a grid."""
    if isinstance(lambdas, Adaptive):
        return lambdas.check()
    if isinstance(lambdas, str) and lambdas == "adaptive":
        return Adaptive()
    return None


def _signed(by_lam: dict) -> dict:
    la, lb = by_lam[0.0]["loss"], by_lam[1.0]["loss"]
    return {l: r["loss"] - ((1 - l) * la + l * lb) for l, r in by_lam.items()}


def _vertex(x0, y0, x1, y1, x2, y2):
    """The vertex (x, y) of the parabola through three points, or None when it opens upward or is flat."""
    d = (x0 - x1) * (x0 - x2) * (x1 - x2)
    a = (x2 * (y1 - y0) + x1 * (y0 - y2) + x0 * (y2 - y1)) / d
    if not a < 0:
        return None
    b = (x2 * x2 * (y0 - y1) + x1 * x1 * (y2 - y0) + x0 * x0 * (y1 - y2)) / d
    c = (x1 * x2 * (x1 - x2) * y0 + x2 * x0 * (x2 - x0) * y1 + x0 * x1 * (x0 - x1) * y2) / d
    x = -b / (2 * a)
    return x, c - b * b / (4 * a)


def _next_point(signed: dict, min_width: float):
    """(lambda to measure next, the peak the parabola predicts or None), or None when the peak is resolved."""
    lams = sorted(signed)
    i = max(range(1, len(lams) - 1), key=lambda j: signed[lams[j]])
    left, mid, right = lams[i - 1], lams[i], lams[i + 1]
    if right - left < min_width:
        return None
    v = _vertex(left, signed[left], mid, signed[mid], right, signed[right])
    if v is not None and left < v[0] < right and min(abs(v[0] - x) for x in lams) > min_width / 4:
        return v[0], v[1]
    wide_left = mid - left >= right - mid
    return ((left + mid) / 2 if wide_left else (mid + right) / 2), None


def adaptive_points(evaluate, settings: Adaptive) -> tuple[dict, dict]:
    """Run the refinement: `evaluate(lambdas) -> {lambda: metrics}`. Returns every measured point
    and a summary (evaluations, rounds, whether the peak found is resolved to tol, the settings)."""
    start = [i / (settings.start - 1) for i in range(settings.start)]
    by_lam = dict(evaluate(start))
    rounds, resolved = 0, False
    while len(by_lam) < settings.max_evaluations:
        signed = _signed(by_lam)
        before = max(signed.values())
        step = _next_point(signed, settings.min_width)
        if step is None:
            resolved = True
            break
        lam, predicted = step
        by_lam.update(evaluate([lam]))
        rounds += 1
        signed = _signed(by_lam)
        # resolved: the parabola foresaw the new point and the peak rose by less than tol (a bisection
        # that changes little proves nothing about the peak, so it goes on)
        if (predicted is not None and abs(predicted - signed[lam]) < settings.tol
                and max(signed.values()) - before < settings.tol):
            resolved = True
            break
    return by_lam, {"evaluations": len(by_lam), "rounds": rounds, "peak_resolved": resolved, "tol": settings.tol,
                    "start": settings.start, "max_evaluations": settings.max_evaluations}


__all__ = ["Adaptive", "adaptive_points", "as_adaptive"]
