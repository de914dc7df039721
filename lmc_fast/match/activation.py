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
solves every group; no coordinate ascent is needed.
"""
from __future__ import annotations

import time

import torch

from ..models import functional as Fn
from ..symmetry.spec import Spec
from . import solve


#: records of units a permutation group moves, under the group's name: MLP units, and BERT's pooler and
#: masked-LM transform units
UNIT_RECORDS = ("mlp", "pooler", "head_transform")


class CrossStats:
    """Running sums of A^T B for each recorded activation."""

    def __init__(self, arch):
        self.arch = arch
        self.sums: dict[str, torch.Tensor] = {}
        self.tokens = 0

    def _add(self, key, value):
        self.sums[key] = value if key not in self.sums else self.sums[key] + value

    def update(self, rec_a: dict, rec_b: dict):
        H, G, dh = self.arch.n_head, self.arch.n_kv_head, self.arch.head_dim
        grouped = G != H
        for name, a in rec_a.items():
            b = rec_b[name]
            a2, b2 = a.reshape(-1, a.shape[-1]).double(), b.reshape(-1, b.shape[-1]).double()
            kind = name.split(".")[0]
            if kind == "resid":
                a2 = a2 / a2.pow(2).mean(-1, keepdim=True).add(1e-12).sqrt()
                b2 = b2 / b2.pow(2).mean(-1, keepdim=True).add(1e-12).sqrt()
                self._add("residual", a2.T @ b2)
            elif kind in UNIT_RECORDS:
                self._add(name, a2.T @ b2)
            else:  # q, k, v
                circuit = "qk" if kind in ("q", "k") else "vo"
                layer = name.split(".")[1]
                if grouped and kind == "q":
                    term = torch.einsum("niua,njvb->iujvab", a2.reshape(-1, G, H // G, dh), b2.reshape(-1, G, H // G, dh))
                    self._add(f"heads.{layer}.qk_q", term)
                    continue
                n = H if kind == "q" else G
                term = torch.einsum("nia,njb->ijab", a2.reshape(-1, n, dh), b2.reshape(-1, n, dh))
                self._add(f"heads.{layer}.{circuit}" + ("_kv" if grouped else ""), term)
        self.tokens += next(iter(rec_a.values())).shape[1:-1].numel()


@torch.no_grad()
def collect_stats(arch, pa: dict, pb: dict, data, max_batches: int | None = None, progress=None) -> CrossStats:
    stats = CrossStats(arch)
    pa1 = {k: v.unsqueeze(0) for k, v in pa.items()}
    pb1 = {k: v.unsqueeze(0) for k, v in pb.items()}
    first = next(iter(pa.values()))
    dtype, device = first.dtype, first.device
    for i, (x, _) in enumerate(data):
        if max_batches is not None and i >= max_batches:
            break
        x = x.to(device=device, dtype=dtype) if x.is_floating_point() else x.to(device)
        rec_a, rec_b = {}, {}
        Fn.forward(arch, pa1, x, record=lambda n, t: rec_a.__setitem__(n, t))
        Fn.forward(arch, pb1, x, record=lambda n, t: rec_b.__setitem__(n, t))
        stats.update(rec_a, rec_b)
        if progress is not None:
            progress.update(1)
    if stats.tokens == 0:
        raise ValueError("activation matching needs data: the iterable yielded no batches")
    return stats


def activation_matching(spec: Spec, pa: dict, pb: dict, data, *, max_batches: int | None = None, progress=None):
    """Elements mapping B onto A from activation cross-covariances on `data`, and info."""
    if spec.space != "canonical":
        raise ValueError("activation matching works on the canonical spec")
    t0 = time.perf_counter()
    stats = collect_stats(spec.arch, pa, pb, data, max_batches, progress)
    elements = {}
    units = [n for n, g in spec.groups.items() if g.kind == "permutation" and g.layer_local]
    for same in solve.by_size(spec, units):
        perms = solve.solve_permutations(torch.stack([stats.sums[n] for n in same]))
        elements.update({n: {"perm": p} for n, p in zip(same, perms)})
    heads = [n for n, g in spec.groups.items() if g.kind == "heads" and g.group_size == 1]
    if heads:
        perm, qk, vo = solve.solve_heads(torch.stack([stats.sums[n + ".qk"] for n in heads]),
                                         torch.stack([stats.sums[n + ".vo"] for n in heads]),
                                         spec.groups[heads[0]].rotary_dim)
        elements.update({n: {"perm": perm[i], "qk": qk[i], "vo": vo[i]} for i, n in enumerate(heads)})
    grouped = [n for n, g in spec.groups.items() if g.kind == "heads" and g.group_size > 1]
    if grouped:
        c = solve.stack_correlations([{"qk_q": stats.sums[n + ".qk_q"], "qk_kv": stats.sums[n + ".qk_kv"],
                                       "vo_q": None, "vo_kv": stats.sums[n + ".vo_kv"]} for n in grouped])
        perm, qperm, qk, vo = solve.solve_grouped_heads(c, spec.groups[grouped[0]].rotary_dim)
        elements.update({n: {"perm": perm[i], "qperm": qperm[i], "qk": qk[i], "vo": vo[i]}
                         for i, n in enumerate(grouped)})
    if spec.residual is not None:
        group, C = spec.groups[spec.residual], stats.sums["residual"]
        elements[spec.residual] = ({"perm": solve.solve_permutations(C.unsqueeze(0))[0]} if group.kind == "permutation"
                                   else {"matrix": solve.solve_orthogonal(group, C)})
    info = {"method": "activation", "tokens": stats.tokens, "seconds": time.perf_counter() - t0}
    return elements, info
