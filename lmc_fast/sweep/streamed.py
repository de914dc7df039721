"""The barrier of two checkpoints on disk, streamed a layer at a time: the K mixtures' activations of every
evaluation batch carried through the network together, each layer's weights of A and B read once for all
K and all batches, mixed per tensor (K' mixtures at a time within a memory bound, into one reused buffer) once
per group of batches (neighbours of one shape concatenated up to the fused engine's pass size) and dropped.
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
from .batched import MAX_TOKENS
from .batches import reiterable
from .checks import spec_from_model
from .metrics import MetricSums, task_of

#: bytes of one tensor's mixtures made at once (more mixtures: in several passes), in the sweep's dtype
MIX_BYTES = 256 * 2**20


class MixedOps:
    """Fn's ops (`linear`, `norm`) of K mixtures sum_n w_kn theta_n of the loaded parameters of N models.

    `linear` mixes into one scratch buffer that it reuses: a fresh quarter-gigabyte tensor per mixture (a
    7B MLP matrix in float32) costs more in page faults than the mixing itself (profiled at 7B widths, two
    layers: fresh tensors summed from a transposed operand took 0.65 s per MLP mixture, half the sweep; in
    place from contiguous tensors, about 0.09 s)."""

    def __init__(self, arch, weights: torch.Tensor, dtype):
        self.arch, self.w, self.dtype = arch, weights.to(torch.float64), dtype
        self.p = [{} for _ in range(weights.shape[1])]
        self._scratch = torch.empty(0, dtype=dtype)

    def load(self, parts: list[dict]) -> None:
        """Keep the parts' tensors; they should come contiguous (an alignment's action on an input axis leaves
        a transposed view, and mixing a transposed 7B MLP matrix ran 4x slower than a contiguous one)."""
        for store, part in zip(self.p, parts):
            store.update({n: t.contiguous() for n, t in part.items()})

    def drop(self, keep) -> None:
        for store in self.p:
            for n in [n for n in store if not keep(n)]:
                del store[n]

    def mixed(self, name: str, k0: int, k1: int, out: torch.Tensor | None = None) -> torch.Tensor:
        """The mixtures k0:k1 of one parameter, (k1 - k0, ...), summed in the sweep's dtype (float64 for float64
        sweeps; a float64 copy of a 7B model's head would not fit the memory bound), into `out` when given."""
        ts = [store[name].to(self.dtype) for store in self.p]
        if out is None:
            out = torch.empty((k1 - k0, *ts[0].shape), dtype=self.dtype)
        w = self.w[k0:k1].to(self.dtype).tolist()  # each weight rounded to the dtype, as the terms are
        for j, wj in enumerate(w):
            torch.mul(ts[0], wj[0], out=out[j])
            for t, wn in zip(ts[1:], wj[1:]):
                out[j].add_(t, alpha=wn)
        return out

    def _chunks(self, name: str):
        K = self.w.shape[0]
        per = max(1, MIX_BYTES // max(1, self.p[0][name].numel() * self.dtype.itemsize))
        return [(k, min(k + per, K)) for k in range(0, K, per)]

    def _buffer(self, name: str, k0: int, k1: int) -> torch.Tensor:
        """A view of the reused scratch shaped for mixtures k0:k1 of `name`."""
        shape = self.p[0][name].shape
        n = (k1 - k0) * self.p[0][name].numel()
        if self._scratch.numel() < n:
            self._scratch = torch.empty(n, dtype=self.dtype)
        return self._scratch[:n].view(k1 - k0, *shape)

    def linear(self, x: torch.Tensor, name: str) -> torch.Tensor:
        W, b = name + ".weight", name + ".bias"
        chunks, out = self._chunks(W), None
        for k0, k1 in chunks:
            bias = self.mixed(b, k0, k1) if b in self.p[0] else None
            y = Fn.linear(x[k0:k1], self.mixed(W, k0, k1, self._buffer(W, k0, k1)), bias)
            if len(chunks) == 1:
                return y
            if out is None:  # filled chunk by chunk: a list of the chunks and their cat would hold it twice
                out = y.new_empty((x.shape[0], *y.shape[1:]))
            out[k0:k1] = y
        return out

    def norm(self, x: torch.Tensor, name: str) -> torch.Tensor:
        W, b = name + ".weight", name + ".bias"
        K = self.w.shape[0]
        return Fn.norm(self.arch, x, self.mixed(W, 0, K), self.mixed(b, 0, K) if b in self.p[0] else None)

    def tensor(self, name: str) -> torch.Tensor:
        return self.mixed(name, 0, self.w.shape[0])

    def one(self, k: int) -> dict:
        """Mixture k of every loaded parameter, {name: (1, ...)}: what the head reads for all batches at once."""
        return {name: self.mixed(name, k, k + 1) for name in self.p[0]}


def grouped(batches: list, budget: int, size=lambda x: x.numel()) -> list:
    """The batches as fewer, larger ones: neighbours whose inputs and targets agree past the first (batch)
    dimension are concatenated while the group's `size` (input elements unless given) stays within `budget` (a
    batch over it stays alone, as does one that is not a pair of tensors). A layer's weights are then mixed once per group, not
    once per batch; the metrics are sums, so the results do not change."""
    def key(x, y):
        return (x.shape[1:], x.dtype, y.shape[1:], y.dtype) if torch.is_tensor(x) and torch.is_tensor(y) else None
    groups, total = [], 0
    for x, y in batches:
        k = key(x, y)
        if groups and k is not None and k == key(*groups[-1][-1]) and total + size(x) <= budget:
            groups[-1].append((x, y))
            total += size(x)
        else:
            groups.append([(x, y)])
            total = size(x) if k is not None else 0
    return [g[0] if len(g) == 1 else (torch.cat([x for x, _ in g]), torch.cat([y for _, y in g])) for g in groups]


def _tokens(arch, shapes: dict):
    """Positions of the residual stream per input batch: the ids of a token model; a sample's patches (the
    position table's rows) for images, and every input element where there is no such table (an upper bound)."""
    if arch.inputs == "tokens":
        return lambda x: x.numel()
    rows = shapes.get("pos_embed", (None,))[-2] if len(shapes.get("pos_embed", ())) >= 2 else None
    return (lambda x: x.shape[0] * rows) if rows else (lambda x: x.numel())


def _plan_terms(arch, shapes: dict, K: int, stream_tokens: int, itemsize: int) -> tuple[int, int, int]:
    """(bytes while the parameters around the layers are read, bytes of the layer phase without a group, bytes
    per token of a group): the planned peak is max(first, fixed + per_token * group tokens) (planned_bytes)."""
    numel = lambda shape: int(torch.Size(shape).numel())  # noqa: E731
    outer = sum(numel(sh) for n, sh in shapes.items() if not n.startswith("blocks."))
    layers: dict = {}
    for n, sh in shapes.items():
        if n.startswith("blocks."):
            layers[n.split(".")[1]] = layers.get(n.split(".")[1], 0) + numel(sh)
    layer = max(layers.values(), default=0)
    # the logits' width: the head's rows, or the token table's where the head is tied to it
    head = next((n for n in ("lm_head.weight", "head.weight") if n in shapes), None)
    out_width = next((shapes[n][0] for n in (head, "tok_embed.weight") if n in shapes), arch.d_model)
    # a token table is read whole (and moved) once, then kept as the batches' rows only, unless it is the head
    table = numel(shapes["tok_embed.weight"]) if arch.inputs == "tokens" and head is not None else 0
    first = (2 * outer + table) * itemsize
    stream = K * stream_tokens * arch.d_model * itemsize
    fixed = (2 * (outer - table) + 3 * layer) * itemsize + MIX_BYTES + stream
    per_token = (K * (3 * arch.d_mlp + 4 * arch.d_model) + 2 * out_width) * itemsize
    return first, fixed, per_token


def planned_bytes(arch, shapes: dict, K: int, stream_tokens: int, group_tokens: int, itemsize: int) -> int:
    """The streamed barrier's peak above its start, planned before anything is read: both models' parameters
    around the layers, the largest layer of both with B's moved copy beside it, the mixing buffer, the stream
    carried through (K mixtures of every token of this rank), one group's transients (q, k, v, o and the MLP's
    three products per mixture and token) and one mixture's logits twice (log-softmax). At Mistral-7B shapes
    (K = 11, 512 tokens a rank) it plans 5.5 GB; the bench measured 5.2 GB above the start (5.9 GB in all)."""
    first, fixed, per_token = _plan_terms(arch, shapes, K, stream_tokens, itemsize)
    return max(first, fixed + per_token * group_tokens)


def plan_groups(arch, shapes: dict, K: int, batches: list, dtype, max_memory: int | None) -> tuple[list, int]:
    """(the batches grouped, the planned peak bytes): groups of up to the fused engine's pass size
    (MAX_TOKENS["cpu"] // K tokens) when they fit in `max_memory` (else the machine's available memory), else
    as large as fit; refused in one line, before anything is read, when even one batch at a time does not fit."""
    from .checks import format_gb, memory_limit

    tokens = _tokens(arch, shapes)
    sizes = [tokens(x) for x, _ in batches if torch.is_tensor(x)]
    first, fixed, per_token = _plan_terms(arch, shapes, K, sum(sizes), dtype.itemsize)
    free = memory_limit("cpu", max_memory)
    budget = max(1, MAX_TOKENS["cpu"] // K)
    if free is not None and max(first, fixed + per_token * max(budget, max(sizes, default=0))) > free:
        need = max(first, fixed + per_token * max(sizes, default=0))
        if need > free:
            raise ValueError(f"streamed sweep needs about {format_gb(need)} ({K} mixtures of {sum(sizes)} tokens "
                             f"carried through, {str(dtype).replace('torch.', '')}) but only {format_gb(free)} is "
                             "available; use fewer or smaller batches (or more ranks) or fewer lambdas")
        budget = min(budget, (free - fixed) // per_token)
    groups = grouped(batches, budget, tokens)
    widest = max((tokens(x) for x, _ in groups if torch.is_tensor(x)), default=0)
    return groups, max(first, fixed + per_token * widest)


def barrier_paths(path_a, path_b, data, lambdas=11, *, align=None, space: str = "canonical", dtype=torch.float32,
                  max_batches: int | None = None, progress: bool = False, distributed: bool | None = None,
                  max_memory: int | None = None):
    """The BarrierResult of the linear path from checkpoint `path_a` to `path_b` (B moved by `align`, in its
    space; else `space`), streamed. Lambdas as `lf.barrier` takes them: a count, values, or "adaptive"
    (`Adaptive`), where every round is a pass over both checkpoints (read and aligned again): worth it when
    the data is large enough that K mixtures' forward outweighs a pass (`res.streamed["seconds"]` says).
    Under torchrun (or `distributed=True`) each rank carries its share of the batches and the metric sums
    are all-reduced, as in the fused engine (sweep/shard.py): every rank returns the whole result, so every
    rank takes the same adaptive rounds."""
    from .adaptive import adaptive_points, as_adaptive
    from .shard import shard_of
    from ..models.adapters import check_compatible
    from ..stream.checkpoint import StreamedCheckpoint
    from ..stream.forward import collect_batches
    from ..stream.pieces import Blocks

    t0 = time.perf_counter()
    adaptive = as_adaptive(lambdas)
    lams = None if adaptive is not None else lambda_grid(lambdas)
    a, b = StreamedCheckpoint(path_a), StreamedCheckpoint(path_b)
    check_compatible(a.model, b.model, mlp="equal")
    if align is not None:
        align.validate()
        spec = align.spec
    else:
        spec = spec_for(a.arch, space)
    shard = shard_of(distributed)
    batches = collect_batches(reiterable(data), spec_from_model(a.model), max_batches)
    total_tokens = sum(x.numel() for x, _ in batches)
    if shard is not None:
        batches = batches[shard[0]::shard[1]]
    K = adaptive.start if adaptive is not None else len(set(lams) | {0.0, 1.0})
    # the groups carried together, planned once (a round of adaptive lambdas has fewer mixtures than K)
    groups, planned = plan_groups(spec.arch, Blocks([a, b], spec, dtype).shapes, K, batches, dtype, max_memory)
    sweep = _Pass(a, b, spec, align, dtype, groups, shard)
    if adaptive is not None:  # a coarse grid, then one point a round at the peak (sweep/adaptive.py)
        by_lam, info = adaptive_points(sweep, adaptive)
        res = barrier_result(sorted(by_lam), by_lam, spec.space, "streamed", time.perf_counter() - t0)
        res.adaptive = info
    else:
        res = barrier_result(lams, sweep(sorted(set(lams) | {0.0, 1.0})), spec.space, "streamed",
                             time.perf_counter() - t0)
    res.streamed = {"bytes_read": sweep.bytes_read, "tokens": total_tokens, "passes": sweep.passes,
                    "lambdas": sweep.evaluated, "groups": sweep.groups,  # this rank's: how often a layer is mixed
                    "ranks": 1 if shard is None else shard[1], "seconds": sweep.clock, "planned_bytes": planned,
                    # the share of B's elements this rank moved by the alignment (the others' came broadcast)
                    "aligned_here": sweep.aligned_share()}
    return res


class _Pass:
    """One streamed pass: `(lambdas) -> {lambda: metrics}`, every batch group's mixtures carried through the
    layers of both checkpoints together. Counts what the passes read and where their seconds went: what a pass
    costs whatever K is (reading, the canonical form, the alignment's action) against what the K mixtures cost
    (mixing, the forward), which says what more lambdas, or more passes, cost."""

    def __init__(self, a, b, spec, align, dtype, batches: list, shard):
        self.cks, self.spec, self.align, self.dtype, self.shard = [a, b], spec, align, dtype, shard
        self.batches = batches  # this rank's batch groups (plan_groups)
        self.bytes_read, self.passes, self.evaluated, self.groups = 0, 0, 0, 0
        self.clock = {"read_and_align": 0.0, "layers": 0.0, "head": 0.0}
        self._load = [0] * (1 if shard is None else shard[1])  # elements each rank has moved (_owners)

    def _aligned(self, parts):
        """[A's part, B's part moved by the alignment], contiguous (mixing a transposed view is slow). Under
        torchrun each rank moves its share of the tensors and broadcasts them: the residual rotation of every
        B tensor is most of a pass's fixed cost (a 4096-wide rotation of a 7B layer, 1.8 TFLOP), and every
        rank needs the whole layer."""
        if self.shard is None:
            moved = self.align.apply_params(parts[1])
            for name in moved:  # one by one: each transposed view's storage goes as its copy replaces it
                moved[name] = moved[name].contiguous()
            return [parts[0], moved]
        import torch.distributed as dist

        rank, world = self.shard
        owner = self._owners(parts[1], world)
        mine = self.align.apply_params({n: t for n, t in parts[1].items() if owner[n] == rank})
        moved = {}
        for name, t in parts[1].items():  # the same order on every rank: the blocks' order
            # the action keeps shape and dtype (each group's maps are cast to the tensor's dtype)
            moved[name] = mine.pop(name).contiguous() if owner[name] == rank else torch.empty_like(t)
            dist.broadcast(moved[name], src=owner[name])
        return [parts[0], moved]

    def aligned_share(self) -> float | None:
        if self.align is None:
            return None
        return 1.0 if self.shard is None else self._load[self.shard[0]] / max(1, sum(self._load))

    def _owners(self, part: dict, world: int) -> dict:
        """Which rank moves each tensor: largest first to the least loaded rank so far in this pass, the same on
        every rank (the blocks come in the same order everywhere)."""
        load, owner = self._load, {}
        for name in sorted(part, key=lambda n: (-part[n].numel(), n)):
            r = min(range(world), key=lambda i: (load[i], i))
            owner[name] = r
            load[r] += part[name].numel()
        return owner

    def __call__(self, lams: list) -> dict:
        from .shard import reduce_sums
        from ..stream.forward import LayerForward
        from ..stream.pieces import Blocks

        arch, dtype, clock = self.spec.arch, self.dtype, self.clock
        batches = self.batches
        blocks = Blocks(self.cks, self.spec, dtype)
        weights = torch.tensor([[1.0 - l, l] for l in lams], dtype=torch.float64)
        t = time.perf_counter()
        fwd = LayerForward(blocks, batches, self._aligned if self.align is not None else None)
        clock["read_and_align"] += time.perf_counter() - t
        ops = MixedOps(arch, weights, dtype)
        ops.load(fwd.outer)
        hs = []
        for x, _ in batches:
            # the embedding is linear in the parameters: the end models' sums, mixed
            ends = [fwd.embedded(i, x)[0].to(torch.float64) for i in range(2)]
            h = sum(weights[:, n].reshape(-1, 1, 1, 1) * e for n, e in enumerate(ends)).to(dtype)
            hs.append(Fn.embed_norm(arch, ops, h))
        for l in range(arch.n_layer):
            t = time.perf_counter()
            ops.load(fwd.layer(l))
            t1 = time.perf_counter()
            hs = [Fn.block(arch, ops, l, h) for h in hs]
            ops.drop(lambda n: not n.startswith(f"blocks.{l}."))
            clock["read_and_align"] += t1 - t
            clock["layers"] += time.perf_counter() - t1
        t = time.perf_counter()
        task = task_of(arch)
        sums = [MetricSums(is_lm=task != "classify", task=task) for _ in lams]
        for k in range(len(lams)):
            mixture = ops.one(k)  # the head's parameters mixed once for every batch
            for h, (_, y) in zip(hs, batches):
                sums[k].add(Fn.head(arch, mixture, h[k:k + 1])[0], y)
            del mixture
        clock["head"] += time.perf_counter() - t
        sums = reduce_sums(sums, self.shard)
        self.bytes_read += blocks.bytes_read
        self.passes += 1
        self.evaluated += len(lams)
        self.groups = len(batches)
        return {lam: s.result() for lam, s in zip(lams, sums)}
