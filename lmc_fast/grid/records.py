"""The schema of a grid's unit records (OUT/units/<key>.json), checked in full when one is read back.

A record is trusted only if every field the summaries, plots and results.jsonl read has its type,
its range, its length, and agrees with the numbers it is derived from: the barrier with the curve
(max of loss minus the chord), the loss and accuracy at 0.5 with the curve, the simplex's centroid
and worst excess with its rows. Anything else (an edited number, a string barrier, a missing
curve) is a damaged record: the unit is computed again. Non-finite numbers are stored as null
(strict JSON), so null stands for one wherever a float is expected.
"""
from __future__ import annotations

import math

#: the agreement asked of numbers derived from each other (they were computed in float64)
_TOL = 1e-9


class DamagedRecord(ValueError):
    pass


def _need(ok: bool, what: str) -> None:
    if not ok:
        raise DamagedRecord(what)


def _num(v, what: str, lo: float = -math.inf, hi: float = math.inf):
    """A float (or an int) within [lo, hi], or None (a non-finite value stored as null)."""
    if v is None:
        return None
    _need(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v), f"{what} is not a number")
    _need(lo - _TOL <= v <= hi + _TOL, f"{what} {v!r} outside [{lo}, {hi}]")
    return float(v)


def _nums(v, n: int, what: str, lo: float = -math.inf, hi: float = math.inf) -> list:
    _need(isinstance(v, list) and len(v) == n, f"{what} is not a list of {n} numbers")
    return [_num(x, f"{what}[{i}]", lo, hi) for i, x in enumerate(v)]


def _close(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return abs(a - b) <= _TOL * max(1.0, abs(a), abs(b))


def _dict(v, keys, what: str) -> dict:
    _need(isinstance(v, dict), f"{what} is not an object")
    missing = [k for k in keys if k not in v]
    _need(not missing, f"{what} lacks {', '.join(missing)}")
    return v


_COMMON = ("unit", "key", "method", "options", "space", "data", "split", "examples", "info", "seconds", "rank", "date")


def _check_common(r: dict, key: str) -> None:
    _need(r["key"] == key, "the record of another unit")
    _need(isinstance(r["method"], str) and isinstance(r["options"], dict), "method or options of the wrong type")
    _need(r["space"] in ("raw", "canonical"), f"space {r['space']!r}")
    _need(isinstance(r["examples"], int) and not isinstance(r["examples"], bool) and r["examples"] >= 1,
          f"examples {r['examples']!r} is not a count >= 1")
    _need(isinstance(r["seconds"], dict) and all(_num(v, "seconds", 0) is not None for v in r["seconds"].values()),
          "seconds are not numbers >= 0")


def _check_curve(r: dict, lambdas: list) -> None:
    c = _dict(r["curve"], ("lambdas", "loss", "acc", "ece", "loss_a", "loss_b", "acc_a", "acc_b", "barrier",
                           "acc_barrier", "signed"), "curve")
    n = len(lambdas)
    _need(c["lambdas"] == lambdas, "curve at other lambdas than the grid's")
    loss, acc = _nums(c["loss"], n, "curve.loss", 0), _nums(c["acc"], n, "curve.acc", 0, 1)
    _nums(c["ece"], n, "curve.ece", 0, 1)
    signed = _nums(c["signed"], n, "curve.signed")
    la, lb = _num(c["loss_a"], "curve.loss_a", 0), _num(c["loss_b"], "curve.loss_b", 0)
    aa, ab = _num(c["acc_a"], "curve.acc_a", 0, 1), _num(c["acc_b"], "curve.acc_b", 0, 1)
    # the ends are evaluated whether or not the grid's lambdas hold them
    if lambdas[0] == 0.0:
        _need(_close(la, loss[0]) and _close(aa, acc[0]), "curve's model A differs from its point at 0")
    if lambdas[-1] == 1.0:
        _need(_close(lb, loss[-1]) and _close(ab, acc[-1]), "curve's model B differs from its point at 1")
    if None not in (la, lb, aa, ab) and None not in loss and None not in acc:
        want = [v - ((1 - t) * la + t * lb) for v, t in zip(loss, lambdas)]
        _need(all(_close(s, w) for s, w in zip(signed, want)), "curve.signed is not loss minus the chord")
        _need(_close(_num(c["barrier"], "curve.barrier"), max(want)), "curve.barrier is not the curve's maximum")
        drop = max((1 - t) * aa + t * ab - v for v, t in zip(acc, lambdas))
        _need(_close(_num(c["acc_barrier"], "curve.acc_barrier"), drop), "curve.acc_barrier is not the largest drop")
    for field in ("barrier", "acc_barrier"):
        _need(_close(_num(r[field], field), _num(c[field], f"curve.{field}")), f"{field} differs from the curve's")
    mid = min(range(n), key=lambda j: abs(lambdas[j] - 0.5))
    _need(_close(_num(r["loss_mid"], "loss_mid", 0), loss[mid]) and _close(_num(r["acc_mid"], "acc_mid", 0, 1), acc[mid]),
          "loss_mid or acc_mid differs from the curve at 0.5")


def _check_simplex(r: dict, n_models: int, samples: int) -> None:
    s = _dict(r["simplex"], ("models", "centroid", "samples", "worst"), "simplex")
    _need(r["samples"] == samples and isinstance(s["samples"], list) and len(s["samples"]) == samples,
          f"not the grid's {samples} samples")
    _need(isinstance(s["models"], list) and len(s["models"]) == n_models, f"not {n_models} model rows")

    def row(x, what):
        x = _dict(x, ("weights", "loss", "acc", "ece", "excess", "acc_drop"), what)
        w = _nums(x["weights"], n_models, f"{what}.weights", 0, 1)
        _need(None not in w and abs(sum(w) - 1) <= 1e-6, f"{what}.weights do not sum to 1")
        _num(x["loss"], f"{what}.loss", 0), _num(x["acc"], f"{what}.acc", 0, 1), _num(x["ece"], f"{what}.ece", 0, 1)
        _num(x["acc_drop"], f"{what}.acc_drop", -1, 1)
        return _num(x["excess"], f"{what}.excess")

    for i, m in enumerate(s["models"]):
        row(m, f"simplex.models[{i}]")
    excess = [row(x, f"simplex.samples[{i}]") for i, x in enumerate(s["samples"])]
    centroid = row(s["centroid"], "simplex.centroid")
    _need(_close(_num(r["centroid"], "centroid"), centroid), "centroid differs from the simplex's centroid row")
    c = s["centroid"]
    _need(_close(_num(r["centroid_loss"], "centroid_loss", 0), _num(c["loss"], "c")) and
          _close(_num(r["centroid_acc"], "centroid_acc", 0, 1), _num(c["acc"], "c")) and
          _close(_num(r["centroid_acc_drop"], "centroid_acc_drop", -1, 1), _num(c["acc_drop"], "c")),
          "centroid loss or accuracy differs from the simplex's centroid row")
    if samples:
        worst = row(s["worst"], "simplex.worst")
        finite = [e for e in excess if e is not None]
        _need(not finite or _close(worst, max(finite)), "simplex.worst is not the sample of the largest excess")
        _need(_close(_num(r["worst"], "worst"), worst), "worst differs from the simplex's worst row")
    else:
        _need(r["worst"] is None and s["worst"] is None, "a worst sample without samples")


def check_record(record, unit, spec) -> dict:
    """`record` if it is a finished, undamaged record of `unit` in grid `spec`; DamagedRecord (a
    ValueError naming the first problem) otherwise."""
    _need(isinstance(record, dict), "not a JSON object")
    if unit.kind == "simplex":
        r = _dict(record, _COMMON + ("kind", "models", "centroid", "centroid_loss", "centroid_acc", "centroid_acc_drop",
                                     "worst", "samples", "alpha", "simplex"), "the record")
        _need(r["kind"] == "simplex", "not a simplex record")
        _check_common(r, unit.key)
        _check_simplex(r, len(unit.models), spec.simplex_samples)
    else:
        r = _dict(record, _COMMON + ("pair", "barrier", "acc_barrier", "loss_mid", "acc_mid", "curve"), "the record")
        _need(r.get("kind", "pair") == "pair", "not a pair record")
        _check_common(r, unit.key)
        _check_curve(r, list(spec.lambdas))
    return record


__all__ = ["DamagedRecord", "check_record"]
