"""The barrier of two checkpoints on disk, streamed a layer at a time: the K mixtures' activations of every
evaluation batch carried through the network together, each layer's weights of A and B read once for all
K and all batches, mixed per tensor (K' mixtures at a time within a memory bound) and dropped.
Memory: one layer of each model, the activations (K x tokens x width), one mixture's logits.

    res = lf.barrier("runs/a", "runs/b", data, lambdas=11, align=al)     # al from lf.align(path_a, path_b)

The numbers are the in-memory fused engine's (same functional forward, metrics summed in float64).
"""
from __future__ import annotations

import time

import torch

from ..models import functional as Fn
from ..symmetry import spec_for
from .result import barrier_result, lambda_grid
from .batches import reiterable
from .checks import spec_from_model
from .metrics import MetricSums, task_of

#: bytes of one tensor's K stacked mixtures made at once (more mixtures: in several passes)
MIX_BYTES = 256 * 2**20


class MixedOps:
    """Fn's ops (`linear`, `norm`) of K mixtures sum_n w_kn theta_n of the loaded parameters of N models."""

    def __init__(self, arch, weights: torch.Tensor, dtype):
        self.arch, self.w, self.dtype = arch, weights.to(torch.float64), dtype
        self.p = [{} for _ in range(weights.shape[1])]

    def load(self, parts: list[dict]) -> None:
        for store, part in zip(self.p, parts):
            store.update(part)

    def drop(self, keep) -> None:
        for store in self.p:
            for n in [n for n in store if not keep(n)]:
                del store[n]

    def mixed(self, name: str, k0: int, k1: int) -> torch.Tensor:
        """The mixtures k0:k1 of one parameter, (k1 - k0, ...): summed in float64 for float64 sweeps, in the
        sweep's dtype otherwise (a float64 copy of a 7B model's head would not fit the memory bound)."""
        acc_dtype = torch.float64 if self.dtype == torch.float64 else self.dtype
        acc = None
        for n, store in enumerate(self.p):
            t = store[name].to(acc_dtype)
            term = self.w[k0:k1, n].to(acc_dtype).reshape(-1, *([1] * t.dim())) * t
            acc = term if acc is None else acc + term
        return acc.to(self.dtype)

    def _chunks(self, name: str):
        K = self.w.shape[0]
        per = max(1, MIX_BYTES // max(1, self.p[0][name].numel() * 8))  # float64 scratch per mixture
        return [(k, min(k + per, K)) for k in range(0, K, per)]

    def linear(self, x: torch.Tensor, name: str) -> torch.Tensor:
        W, b = name + ".weight", name + ".bias"
        outs = []
        for k0, k1 in self._chunks(W):
            bias = self.mixed(b, k0, k1) if b in self.p[0] else None
            outs.append(Fn.linear(x[k0:k1], self.mixed(W, k0, k1), bias))
        return torch.cat(outs) if len(outs) > 1 else outs[0]

    def norm(self, x: torch.Tensor, name: str) -> torch.Tensor:
        W, b = name + ".weight", name + ".bias"
        K = self.w.shape[0]
        return Fn.norm(self.arch, x, self.mixed(W, 0, K), self.mixed(b, 0, K) if b in self.p[0] else None)

    def tensor(self, name: str) -> torch.Tensor:
        return self.mixed(name, 0, self.w.shape[0])


def barrier_paths(path_a, path_b, data, lambdas=11, *, align=None, space: str = "canonical", dtype=torch.float32,
                  max_batches: int | None = None, progress: bool = False, distributed: bool | None = None):
    """The BarrierResult of the linear path from checkpoint `path_a` to `path_b` (B moved by `align`, in its
    space; else `space`), streamed. Lambdas as `lf.barrier` takes them (a count or values; not adaptive).
    Under torchrun (or `distributed=True`) each rank carries its share of the batches and the metric sums
    are all-reduced, as in the fused engine (sweep/shard.py): every rank returns the whole result."""
    from .shard import reduce_sums, shard_of
    from ..stream.checkpoint import StreamedCheckpoint
    from ..stream.forward import LayerForward, collect_batches
    from ..stream.pieces import Blocks

    t0 = time.perf_counter()
    if lambdas == "adaptive":
        raise ValueError("lambdas='adaptive' needs the models in memory; a streamed sweep takes a count or values")
    lams = lambda_grid(lambdas)
    points = sorted(set(lams) | {0.0, 1.0})
    a, b = StreamedCheckpoint(path_a), StreamedCheckpoint(path_b)
    from ..models.adapters import check_compatible

    check_compatible(a.model, b.model, mlp="equal")
    if align is not None:
        align.validate()
        spec = align.spec
    else:
        spec = spec_for(a.arch, space)
    arch = spec.arch
    shard = shard_of(distributed)
    batches = collect_batches(reiterable(data), spec_from_model(a.model), max_batches)
    total_tokens = sum(x.numel() for x, _ in batches)
    if shard is not None:
        batches = batches[shard[0]::shard[1]]
    blocks = Blocks([a, b], spec, dtype)
    weights = torch.tensor([[1.0 - l, l] for l in points], dtype=torch.float64)
    aligned = (lambda parts: [parts[0], align.apply_params(parts[1])]) if align is not None else None
    fwd = LayerForward(blocks, batches, aligned)
    ops = MixedOps(arch, weights, dtype)
    ops.load(fwd.outer)
    hs = []
    for x, _ in batches:
        # the embedding is linear in the parameters: the end models' sums, mixed
        ends = [fwd.embedded(i, x)[0].to(torch.float64) for i in range(2)]
        h = sum(weights[:, n].reshape(-1, 1, 1, 1) * e for n, e in enumerate(ends)).to(dtype)
        hs.append(Fn.embed_norm(arch, ops, h))
    for l in range(arch.n_layer):
        ops.load(fwd.layer(l))
        hs = [Fn.block(arch, ops, l, h) for h in hs]
        ops.drop(lambda n: not n.startswith(f"blocks.{l}."))
    task = task_of(arch)
    sums = [MetricSums(is_lm=task != "classify", task=task) for _ in points]
    for h, (_, y) in zip(hs, batches):
        for k in range(len(points)):
            one = MixedOps(arch, weights[k:k + 1], dtype)
            one.p = ops.p
            sums[k].add(Fn.head(arch, one, h[k:k + 1])[0], y)
    sums = reduce_sums(sums, shard)
    rows = {lam: s.result() for lam, s in zip(points, sums)}
    res = barrier_result(lams, rows, spec.space, "streamed", time.perf_counter() - t0)
    res.streamed = {"bytes_read": blocks.bytes_read, "tokens": total_tokens, "lambdas": len(points),
                    "ranks": 1 if shard is None else shard[1]}
    return res
