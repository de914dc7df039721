"""The per-point engine: for each mixture, mix the parameters, build that model, evaluate it.

The baseline every prior tool runs, and the reference the batched engines are tested against.
"""
from __future__ import annotations

from ..models.adapters import adapter_for
from .batches import limited
from .interpolate import mix
from .metrics import evaluate


def evaluate_per_point(template, params_list, weights, data, max_batches=None, progress=None) -> list[dict]:
    """One metrics dict per row of `weights`; `template` (a model of the architecture) is what
    each mixture's parameters are loaded into."""
    adapter = adapter_for(template)
    out = []
    for w in weights:
        model = adapter.build(template, mix(params_list, w))
        out.append(evaluate(model, limited(data, max_batches)))
        if progress is not None:
            progress.update(1)
    return out


__all__ = ["evaluate_per_point"]
