"""The one check of every matching option (`lf.align`'s keywords, a grid's [methods.NAME] values).

`check_option(name, value)` returns the value or raises a one-line ValueError naming the option,
the range and the value. `lf.align` checks every option it is given before any work, the grid
spec checks its [methods.*] values with it at parse time, and the loops that read an option
(learned matching, learned merging) check it with the same function, so one rule holds
everywhere. The values are plain Python ones.
"""
from __future__ import annotations

import math
import numbers

from ..symmetry.spec import HEAD_MAPS

ORDERS = ("structured", "random")
#: the weightings of weight matching's objective (weighting.py `weighted_reference` computes each)
WEIGHTINGS = ("sum", "per_tensor", "sqrt")
LAMBDA_MODES = ("narrow", "uniform", "mixed", "fixed")
TARGETS = ("labels", "endpoints")
#: which latents learned matching trains: every one; the maps (residual rotation, per-head maps); the
#: residual's alone; the permutations; one family of groups (the heads, the MLP units); all but the residual
LEARN_MODES = ("all", "continuous", "residual", "permutations", "heads", "mlp", "no_residual")
#: whose elements learned matching trains: B's alone (A is the fixed reference), or both models' (A's
#: latents start at the identity; LMC-DM's shared path)
SIDES = ("b", "both")
PRESET_NAMES = ("default", "paper", "distill", "labels", "distill-loop", "labels-loop")
#: most steps / iterations one run takes (past this it is a typo, and a grid would run for weeks)
MAX_STEPS = 10_000_000


def _is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _is_real(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(float(v))


def _int(lo: int, hi: int = MAX_STEPS, none: bool = False):
    def check(name, v):
        if none and v is None:
            return v
        if not _is_int(v) or not lo <= v <= hi:
            raise ValueError(f"{name} must be a whole number in [{lo}, {hi}]{' or None' if none else ''}, got {v!r}")
        return int(v)
    return check


def _real(lo: float, hi: float = math.inf, lo_open: bool = False, hi_open: bool = False, none: bool = False):
    def check(name, v):
        if none and v is None:
            return v
        ok = _is_real(v) and (lo < v if lo_open else lo <= v) and (v < hi if hi_open else v <= hi)
        if not ok:
            rng = (f"{'>' if lo_open else '>='} {lo:g}" if hi == math.inf else
                   f"in {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}")
            raise ValueError(f"{name} must be a finite number {rng}{' or None' if none else ''}, got {v!r}")
        return v
    return check


def _choice(choices, none: bool = False):
    def check(name, v):
        if none and v is None:
            return v
        if not isinstance(v, str) or v not in choices:
            raise ValueError(f"{name} must be one of {', '.join(choices)}, got {v!r}")
        return v
    return check


def _bool(name, v):
    if not isinstance(v, bool):
        raise ValueError(f"{name} must be True or False, got {v!r}")
    return v


def _lam(name, v):
    if isinstance(v, str):
        return _choice(LAMBDA_MODES)(name, v)
    if v is None:
        return v
    if not _is_real(v) or not 0 <= v <= 1:
        raise ValueError(f"{name} must be one of {', '.join(LAMBDA_MODES)} or a number in [0, 1], got {v!r}")
    return v


def _token_counts(name, v):
    """A counts vector or batches (objects, checked against the vocabulary by weighting.py); a
    number or a string, all a grid's TOML can give, is neither."""
    if isinstance(v, (numbers.Number, str, bytes)):
        raise ValueError(f"{name} must be a vocab-length counts vector or (inputs, targets) batches, "
                         f"not a number or a string; got {v!r}")
    return v


def _dtype(name, v):
    if v is not None and not (type(v).__name__ == "dtype" and str(v) in ("torch.float32", "torch.float64")):
        raise ValueError(f"{name} must be torch.float32 or torch.float64, got {v!r}")
    return v


#: option -> check(name, value); None is each learned setting's "take the preset's value"
CHECKS = {
    "seed": _int(0, 2**63 - 1),
    "max_iter": _int(1),
    "tol": _real(0.0),
    "order": _choice(ORDERS),
    "weighting": _choice(WEIGHTINGS, none=True),
    "heads": lambda name, v: v if v is None else _bool(name, v),
    "residual_only": _bool,
    "max_batches": _int(1, none=True),
    "preset": _choice(PRESET_NAMES),
    "steps": _int(1, none=True),
    "lr": _real(0.0, lo_open=True, none=True),
    "lam": _lam,
    "lambdas_per_step": _int(1, 4096, none=True),
    "val_fraction": _real(0.0, 1.0, lo_open=True, hi_open=True, none=True),
    "eval_every": _int(1, none=True),
    "patience": _int(1, none=True),
    "head_map": _choice(HEAD_MAPS),
    "learn": _choice(LEARN_MODES),
    "sides": _choice(SIDES),
    "target": _choice(TARGETS, none=True),
    "temperature": _real(0.0, lo_open=True),
    "weight_decay": _real(0.0, 1.0, hi_open=True, none=True),
    "warmup": _real(0.0, 1.0, hi_open=True, none=True),
    "clip": _real(0.0, lo_open=True, none=True),
    "checkpoint_every": _int(1, none=True),
    "rounds": _int(1),
    "dtype": _dtype,
    "token_counts": _token_counts,
}


def check_option(name: str, value, label: str | None = None):
    """`value` if option `name` may take it (a ValueError naming `label`, default `name`, otherwise);
    options without a rule here (objects such as `init`, `augment`, `device`) pass as they are."""
    check = CHECKS.get(name)
    return value if check is None else check(label or name, value)


def check_options(options: dict, prefix: str = "") -> dict:
    """Every option of `options` checked (`check_option`), named `prefix + name` in a message."""
    return {k: check_option(k, v, prefix + k) for k, v in options.items()}


__all__ = ["CHECKS", "HEAD_MAPS", "LAMBDA_MODES", "LEARN_MODES", "ORDERS", "PRESET_NAMES", "SIDES", "TARGETS",
           "WEIGHTINGS", "check_option", "check_options"]
