"""The schema of a grid's unit records (OUT/units/<key>.json), checked in full when one is read back.

A record is trusted only if every field the summaries, plots and results.jsonl read has its type,
its range, its length, and agrees with the numbers it is derived from: the barrier with the curve
(max of loss minus the chord), the loss and accuracy at 0.5 with the curve, the accuracy and ECE at
every lambda with that lambda's calibration bins (which count the same data at every lambda), the
perplexity with the loss, the simplex's excess and accuracy drop of every row with its loss,
accuracy and the models' rows, its centroid and worst excess with its rows. What the unit's key
holds (data, split, the method's space, the simplex's alpha) must be the grid's; counts (examples,
rank, bytes) are whole numbers >= 0; a curve or simplex has exactly its fields. Anything else (an
edited number, a string barrier, a missing curve, a NaN) is a damaged record: the unit is computed
again. Non-finite numbers are stored as null (strict JSON), so null stands for one wherever a
float is expected.
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


def _count(v, what: str, lo: int = 0) -> int:
    _need(isinstance(v, int) and not isinstance(v, bool) and v >= lo, f"{what} {v!r:.60} is not a count >= {lo}")
    return v


def _check_common(r: dict, unit, spec) -> None:
    from ..match.methods import REGISTRY

    _need(r["key"] == unit.key, "the record of another unit")
    _need(isinstance(r["method"], str) and isinstance(r["options"], dict), "method or options of the wrong type")
    space = REGISTRY[spec.base(unit.method)].space
    _need(r["space"] == space, f"space {r['space']!r:.60} is not the method's {space!r}")
    # the unit's key holds the data and the split: a record of other ones was edited
    _need(r["data"] == spec.data and r["split"] == spec.split, "data or split other than the grid's")
    _count(r["examples"], "examples", 1)
    _count(r["rank"], "rank")
    _need(isinstance(r["date"], str), "date is not text")
    _need(isinstance(r["seconds"], dict) and all(_num(v, "seconds", 0) is not None for v in r["seconds"].values()),
          "seconds are not numbers >= 0")


#: every field a curve (BarrierResult.to_dict) holds
_CURVE = ("lambdas", "loss", "acc", "ece", "ppl", "loss_a", "loss_b", "acc_a", "acc_b", "barrier", "acc_barrier",
          "signed", "signed_min", "signed_max", "space", "engine", "seconds", "reliability", "adaptive", "streamed")
_BINS = 15  # sweep.metrics.ECE_BINS (not imported: that loads torch)


def _check_reliability(rel, acc: list, ece: list) -> None:
    """Per lambda the ECE bins' mean confidence, accuracy and count: in range, the same total at every
    lambda (the same data), and giving back the curve's accuracy and ECE."""
    _need(isinstance(rel, list) and len(rel) == len(acc), f"curve.reliability is not a list of {len(acc)} diagrams")
    totals = set()
    for i, d in enumerate(rel):
        what = f"curve.reliability[{i}]"
        _need(isinstance(d, dict) and set(d) == {"conf", "acc", "n"}, f"{what} is not {{conf, acc, n}}")
        n = d["n"]
        _need(isinstance(n, list) and len(n) == _BINS, f"{what}.n is not {_BINS} counts")
        n = [_count(c, f"{what}.n") for c in n]
        conf, hit = _nums(d["conf"], _BINS, f"{what}.conf", 0, 1), _nums(d["acc"], _BINS, f"{what}.acc", 0, 1)
        _need(all((c is None) == (k == 0) for c, k in zip(conf, n)) and
              all((h is None) == (k == 0) for h, k in zip(hit, n)), f"{what}: an empty bin with a value or the reverse")
        total = sum(n)
        _need(total >= 1, f"{what} counts nothing")
        totals.add(total)
        if acc[i] is not None:
            _need(_close(acc[i], sum(h * k for h, k in zip(hit, n) if k) / total),
                  f"curve.acc[{i}] is not the accuracy of its bins")
        if ece[i] is not None:
            _need(_close(ece[i], sum(abs(c - h) * k for c, h, k in zip(conf, hit, n) if k) / total),
                  f"curve.ece[{i}] is not the ECE of its bins")
    _need(len(totals) <= 1, "curve.reliability counts other data at different lambdas")


def _check_curve(r: dict, lambdas: list) -> None:
    c = _dict(r["curve"], _CURVE, "curve")
    _need(set(c) == set(_CURVE), f"curve has other fields ({', '.join(sorted(set(c) - set(_CURVE)))})")
    n = len(lambdas)
    _need(c["lambdas"] == lambdas, "curve at other lambdas than the grid's")
    loss, acc = _nums(c["loss"], n, "curve.loss", 0), _nums(c["acc"], n, "curve.acc", 0, 1)
    ece = _nums(c["ece"], n, "curve.ece", 0, 1)
    signed = _nums(c["signed"], n, "curve.signed")
    if c["ppl"] is not None:  # language models: exp of the loss (capped as metrics.py does)
        ppl = _nums(c["ppl"], n, "curve.ppl", 1)
        _need(all(p is None or v is not None and _close(p, math.exp(min(v, 700.0))) for p, v in zip(ppl, loss)),
              "curve.ppl is not exp(curve.loss)")
    if c["reliability"] is not None:
        _check_reliability(c["reliability"], acc, ece)
    _need(c["space"] == r["space"], "curve.space differs from the record's")
    _need(isinstance(c["engine"], str), "curve.engine is not text")
    _num(c["seconds"], "curve.seconds", 0)
    _need(c["adaptive"] is None, "an adaptive curve in a grid of fixed lambdas")
    _need(c["streamed"] is None or isinstance(c["streamed"], dict), "curve.streamed is not an object")
    if None not in signed:
        _need(_close(_num(c["signed_min"], "curve.signed_min"), min(signed)) and
              _close(_num(c["signed_max"], "curve.signed_max"), max(signed)),
              "curve.signed_min or signed_max is not the extreme of curve.signed")
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


_SIMPLEX = ("models", "centroid", "samples", "worst", "alpha", "space", "seconds")
_ROW = ("weights", "loss", "acc", "ece", "excess", "acc_drop")


def _check_simplex(r: dict, n_models: int, spec) -> None:
    samples = spec.simplex_samples
    s = _dict(r["simplex"], _SIMPLEX, "simplex")
    _need(set(s) == set(_SIMPLEX), "simplex has other fields")
    _need(r["samples"] == samples and isinstance(s["samples"], list) and len(s["samples"]) == samples,
          f"not the grid's {samples} samples")
    _need(isinstance(s["models"], list) and len(s["models"]) == n_models, f"not {n_models} model rows")
    alpha = _num(r["alpha"], "alpha", 0)
    _need(alpha is not None and _close(alpha, spec.simplex_alpha) and _close(_num(s["alpha"], "simplex.alpha", 0), alpha),
          f"alpha other than the grid's {spec.simplex_alpha}")
    _need(s["space"] == r["space"], "simplex.space differs from the record's")
    _num(s["seconds"], "simplex.seconds", 0)

    def row(x, what):
        """(weights, loss, acc, ece, excess, acc_drop) of a valid row."""
        x = _dict(x, _ROW, what)
        _need(set(x) == set(_ROW), f"{what} has other fields")
        w = _nums(x["weights"], n_models, f"{what}.weights", 0, 1)
        _need(None not in w and abs(sum(w) - 1) <= 1e-6, f"{what}.weights do not sum to 1")
        return (w, _num(x["loss"], f"{what}.loss", 0), _num(x["acc"], f"{what}.acc", 0, 1),
                _num(x["ece"], f"{what}.ece", 0, 1), _num(x["excess"], f"{what}.excess"),
                _num(x["acc_drop"], f"{what}.acc_drop", -1, 1))

    models = [row(m, f"simplex.models[{i}]") for i, m in enumerate(s["models"])]
    for i, m in enumerate(models):
        _need(m[0] == [float(k == i) for k in range(n_models)], f"simplex.models[{i}] is not model {i} alone")
    own_loss, own_acc = [m[1] for m in models], [m[2] for m in models]

    def mixture(x, what):
        """A row whose excess loss and accuracy drop follow from its loss and accuracy and the models' rows."""
        w, loss, acc, _, excess, drop = row(x, what)
        if None not in (loss, acc, *own_loss, *own_acc):
            _need(_close(excess, loss - sum(a * b for a, b in zip(w, own_loss))) and
                  _close(drop, sum(a * b for a, b in zip(w, own_acc)) - acc),
                  f"{what}.excess or acc_drop does not follow from its loss, accuracy and the models' rows")
        return excess

    for i, m in enumerate(s["models"]):
        mixture(m, f"simplex.models[{i}]")  # excess and drop 0
    excess = [mixture(x, f"simplex.samples[{i}]") for i, x in enumerate(s["samples"])]
    centroid = mixture(s["centroid"], "simplex.centroid")
    _need(s["centroid"]["weights"] == [1.0 / n_models] * n_models, "simplex.centroid is not the models' mean")
    _need(_close(_num(r["centroid"], "centroid"), centroid), "centroid differs from the simplex's centroid row")
    c = s["centroid"]
    _need(_close(_num(r["centroid_loss"], "centroid_loss", 0), _num(c["loss"], "c")) and
          _close(_num(r["centroid_acc"], "centroid_acc", 0, 1), _num(c["acc"], "c")) and
          _close(_num(r["centroid_acc_drop"], "centroid_acc_drop", -1, 1), _num(c["acc_drop"], "c")),
          "centroid loss or accuracy differs from the simplex's centroid row")
    if samples:
        worst = mixture(s["worst"], "simplex.worst")
        finite = [e for e in excess if e is not None]
        _need(not finite or s["worst"] in s["samples"] and _close(worst, max(finite)),
              "simplex.worst is not the sample of the largest excess")
        _need(_close(_num(r["worst"], "worst"), worst), "worst differs from the simplex's worst row")
    else:
        _need(r["worst"] is None and s["worst"] is None, "a worst sample without samples")


def _texts(v, n: int, what: str) -> None:
    _need(isinstance(v, list) and len(v) == n and all(isinstance(x, str) for x in v), f"{what} is not {n} paths")


def _check_memory(m) -> None:
    """The unit's peak memory (runner._peak_memory): byte and block counts or null, and where they come from."""
    _need(isinstance(m, dict) and set(m) == {"peak_bytes", "source", "mixtures_per_block", "blocks", "planned_bytes"},
          "memory is not the unit's peak memory")
    _need(isinstance(m["source"], str), "memory.source is not text")
    for k in ("peak_bytes", "mixtures_per_block", "blocks", "planned_bytes"):
        if m[k] is not None:
            _count(m[k], f"memory.{k}")


def check_record(record, unit, spec) -> dict:
    """`record` if it is a finished, undamaged record of `unit` in grid `spec`; DamagedRecord (a
    ValueError naming the first problem) otherwise."""
    from ..match.methods import REGISTRY

    _need(isinstance(record, dict), "not a JSON object")
    aligns = REGISTRY[spec.base(unit.method)].aligns
    if unit.kind == "simplex":
        r = _dict(record, _COMMON + ("kind", "models", "centroid", "centroid_loss", "centroid_acc", "centroid_acc_drop",
                                     "worst", "samples", "alpha", "simplex", "alignments", "alignment_reused"),
                  "the record")
        _need(r["kind"] == "simplex", "not a simplex record")
        _check_common(r, unit, spec)
        _check_simplex(r, len(unit.models), spec)
        k = len(unit.models) - 1 if aligns else 0  # one alignment per model after the first
        _need(isinstance(r["info"], list) and len(r["info"]) == k and all(isinstance(i, dict) for i in r["info"]),
              f"info is not {k} alignments' information")
        _texts(r["alignments"], k, "alignments")
        _need(isinstance(r["alignment_reused"], list) and len(r["alignment_reused"]) == k and
              all(isinstance(b, bool) for b in r["alignment_reused"]), f"alignment_reused is not {k} flags")
    else:
        r = _dict(record, _COMMON + ("pair", "barrier", "acc_barrier", "loss_mid", "acc_mid", "curve", "alignment",
                                     "alignment_reused"), "the record")
        _need(r.get("kind", "pair") == "pair", "not a pair record")
        _check_common(r, unit, spec)
        _check_curve(r, list(spec.lambdas))
        _need(isinstance(r["info"], dict), "info is not an object")
        _need(isinstance(r["alignment"], str) if aligns else r["alignment"] is None,
              "alignment is not the path of the unit's alignment" if aligns else "an alignment of a method that has none")
        _need(isinstance(r["alignment_reused"], bool), "alignment_reused is not true or false")
        if "memory" in r:
            _check_memory(r["memory"])
    return record


__all__ = ["DamagedRecord", "check_record"]
