"""Activation matching: the weight-matching solvers on cross-covariances of activations.

Both canonical models see the same batches; for every group the cross-correlation
sum_n a_n b_n^T is accumulated over tokens:
- residual: the normalised stream h / rms(h) at every block boundary (rotation-equivariant,
  and normalising keeps deep layers from dominating);
- mlp.l: the hidden units after the activation (and BERT's pooler and masked-LM transform units);
- heads.l: per-head queries + keys (QK circuit) and values (VO circuit); with grouped-query
  attention the queries per query head ("qk_q") apart from the keys per key / value head
  ("qk_kv"), the values per key / value head ("vo_kv").
Each group's activations in B depend only on that group's own element, so one pass
solves every group; no coordinate ascent is needed. Each group's statistic is its matcher's
`activation_term` (match/kinds/), laid out as its weight statistic, so the same solvers take it.
"""
from __future__ import annotations

import time

import torch

from ..models import functional as Fn
from ..symmetry.spec import Spec
from .kinds import matcher_of, solve_groups


class CrossStats:
    """Running sums, per group, of its matcher's statistic over the batches' activations."""

    def __init__(self, spec: Spec, names=None):
        self.spec, self.names = spec, list(spec.groups) if names is None else list(names)
        self.sums: dict = {}
        self.tokens = 0

    def update(self, rec_a: dict, rec_b: dict):
        for name in self.names:
            group = self.spec.groups[name]
            term = matcher_of(group).activation_term(group, rec_a, rec_b)
            self.sums[name] = term if name not in self.sums else _add(self.sums[name], term)
        self.tokens += next(iter(rec_a.values())).shape[1:-1].numel()


def _add(total, term):
    if isinstance(term, dict):  # per-part statistics (heads: per circuit)
        return {k: (None if v is None else total[k] + v) for k, v in term.items()}
    return total + term


@torch.no_grad()
def collect_stats(spec: Spec, pa: dict, pb: dict, data, max_batches: int | None = None, progress=None,
                  names=None) -> CrossStats:
    """Each named group's statistic (default: every group) summed over the batches."""
    stats = CrossStats(spec, names)
    pa1 = {k: v.unsqueeze(0) for k, v in pa.items()}
    pb1 = {k: v.unsqueeze(0) for k, v in pb.items()}
    first = next(iter(pa.values()))
    dtype, device = first.dtype, first.device
    for i, (x, _) in enumerate(data):
        if max_batches is not None and i >= max_batches:
            break
        x = x.to(device=device, dtype=dtype) if x.is_floating_point() else x.to(device)
        rec_a, rec_b = {}, {}
        Fn.forward(spec.arch, pa1, x, record=lambda n, t: rec_a.__setitem__(n, t))
        Fn.forward(spec.arch, pb1, x, record=lambda n, t: rec_b.__setitem__(n, t))
        stats.update(rec_a, rec_b)
        if progress is not None:
            progress.update(1)
    if stats.tokens == 0:
        raise ValueError("activation matching needs data: the iterable yielded no batches")
    return stats


def activation_matching(spec: Spec, pa: dict, pb: dict, data, *, max_batches: int | None = None, progress=None,
                        residual_only: bool = False):
    """Elements mapping B onto A from activation cross-covariances on `data`, and info.

    `residual_only`: the statistics of the residual stream alone (the stream's rotation from one
    Procrustes of A's and B's normalised states); every other group then by weight matching given it,
    exactly, since the layer groups are independent once the residual is fixed: the cheap residual
    alignment (no head or MLP statistics), with the weights deciding the rest."""
    if spec.space != "canonical":
        raise ValueError("activation matching works on the canonical spec")
    t0 = time.perf_counter()
    names = [spec.residual] if residual_only and spec.residual is not None else list(spec.groups)
    stats = collect_stats(spec, pa, pb, data, max_batches, progress, names)
    elements = {}
    solve_groups(spec, names, stats.sums, elements)
    if residual_only:
        from ..symmetry.elements import apply_spec, identity
        from .weight import solve_local_rounds

        local = [n for n in spec.groups if n not in names]
        elements.update({n: identity(spec.groups[n], next(iter(pa.values())).dtype) for n in local})
        solve_local_rounds(spec, pa, pb, elements, local)
    info = {"method": "activation", "tokens": stats.tokens, "seconds": time.perf_counter() - t0}
    if residual_only:
        info["residual_only"] = True
    return elements, info


def align_by_activations(model_a, model_b, data, *, dtype=None, progress: bool = False,
                         max_batches: int | None = None, residual_only: bool = False):
    """Method "activation" on two models: both canonical models run on `data` (checked as
    `lf.barrier` checks its batches)."""
    from ..sweep.batches import Checked
    from ..sweep.checks import spec_from_params
    from .pair import params_pair, progress_bar, solved_alignment

    dtype = dtype or torch.float64
    spec, pa, pb = params_pair(model_a, model_b, "canonical", dtype=dtype)
    bar = progress_bar(progress, "activation statistics")
    batches = Checked(data, spec_from_params(spec.arch, pa))
    elements, info = activation_matching(spec, pa, pb, batches, max_batches=max_batches, progress=bar,
                                         residual_only=residual_only)
    if bar is not None:
        bar.close()
    return solved_alignment(spec, elements, info, dtype)
