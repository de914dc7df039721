"""A pair of streamed checkpoints as the pieces weight matching takes (match/weight.py `Piece`): one piece
per block the canonical form transforms on its own (a layer; the embeddings and head), each read,
brought to canonical form, weighted, used and dropped. Only one block of each model is resident.

The token-indexed tensors (embedding, LM head) are the largest of a language model and nothing acts on
their rows, so they come a block of rows at a time: every statistic over them is a sum over rows.
"""
from __future__ import annotations

import math

import torch

from ..match.weight import Piece
from ..match.weighting import weighted_reference
from ..symmetry.canonical import canonical_params, coupled_blocks
from ..symmetry.elements import Transformed
from ..symmetry.spec import Spec
from .checkpoint import StreamedCheckpoint

#: tensors read a block of rows at a time (where only the residual's group acts on them, along columns)
ROW_BLOCKED = ("tok_embed.weight", "lm_head.weight", "lm_head.bias")
#: bytes of one row block in float64: the unit of reading for the token-indexed tensors
ROW_BLOCK_BYTES = 64 * 2**20


class Blocks:
    """Several streamed checkpoints of one architecture read block by block in step: each block (or row
    block of it) of every model at once, in the spec's space (canonical form computed in float64 one
    tensor at a time, handed over in `dtype`), with {name: (start, stop)} of the row blocks in it."""

    def __init__(self, cks: list[StreamedCheckpoint], spec: Spec, dtype=torch.float64,
                 row_block_bytes: int | None = None, shard: tuple[int, int] | None = None):
        first = cks[0]
        for other in cks[1:]:
            if other.shapes != first.shapes:
                bad = next((n for n in first.shapes if other.shapes.get(n) != first.shapes[n]),
                           next(iter(set(other.shapes) - set(first.shapes)), None))
                raise ValueError(f"{other.path} does not fit {first.path}: parameter {bad!r} has shape "
                                 f"{other.shapes.get(bad)}, expected {first.shapes.get(bad)}")
        self.cks, self.spec, self.arch, self.dtype = cks, spec, spec.arch, dtype
        self.shapes = first.shapes
        self.blocks = coupled_blocks(self.arch, list(self.shapes))
        home = {n: i for i, blk in enumerate(self.blocks) for n in blk}
        for name, g in spec.groups.items():
            if g.layer_local and len({home[ax.param] for ax in g.axes}) > 1:
                raise ValueError(f"internal: group {name!r} spans two blocks of the canonical form")
        row_block_bytes = row_block_bytes or ROW_BLOCK_BYTES
        # a row block may go through the steps alone only where the residual's statistics are all that
        # reads the tensor (sums over pieces); a layer's group on it (BERT's head transform on the decoder)
        # must see it whole
        rowed = [n for n in ROW_BLOCKED if n in self.shapes and len(self.shapes[n]) >= 1
                 and all(g.role == "residual" and ax.axis != 0 for g, ax in spec.axes_of(n))]
        self.row_block = {n: max(1, row_block_bytes // (8 * max(1, math.prod(self.shapes[n][1:])))) for n in rowed}
        self.bytes_read = 0
        # (rank, world): this rank takes blocks rank, rank + world, ... (the same ones on every pass, so
        # a layer's groups are always solved where they were before)
        self.shard = shard

    def _read(self, ck: StreamedCheckpoint, name: str, rows=None) -> torch.Tensor:
        t = ck.read(name, rows, dtype=ck.dtype)  # as stored: the canonical form casts one tensor at a time
        self.bytes_read += t.numel() * t.element_size()
        return t

    def _space(self, part: dict) -> dict:
        if self.spec.space == "canonical":
            return canonical_params(self.arch, part, self.dtype, partial=True)
        return {n: t.to(self.dtype) for n, t in part.items()}

    def __call__(self, names=None):
        """Yield ([each model's part], rows); `names`: a predicate choosing the parameters wanted."""
        for index, block in enumerate(self.blocks):
            if self.shard is not None and index % self.shard[1] != self.shard[0]:
                continue
            want = [n for n in block if names is None or names(n)]
            if not want:
                continue
            whole = [n for n in block if n not in self.row_block]
            rowed = [n for n in block if n in self.row_block]  # read even when not wanted: a norm's readers
            base = [{n: self._read(ck, n) for n in whole} for ck in self.cks]
            steps = {n: range(0, self.shapes[n][0], self.row_block[n]) for n in rowed}
            for i in range(max([len(s) for s in steps.values()] + [1])):
                rows = {n: (s[i], min(s[i] + self.row_block[n], self.shapes[n][0]))
                        for n, s in steps.items() if i < len(s)}
                parts = []
                for k, ck in enumerate(self.cks):
                    part = dict(base[k])
                    if not rowed:
                        base[k] = None  # the stored copy goes as its canonical copy is made
                    part.update({n: self._read(ck, n, rows.get(n, (0, 0))) for n in rowed})
                    parts.append(self._space(part))
                    del part
                keep = [n for n in want if n in rows or (i == 0 and n not in self.row_block)]
                out = [{n: p[n] for n in keep} for p in parts]
                del parts
                # the consumer owns the list: emptying it (merge_paths does) frees each model's piece as
                # soon as it is used, rather than when the next block is read
                yield out, {n: rows[n] for n in keep if n in rows}
                del out


class _AcrossRanks:
    """A streamed source of pieces whose blocks may be split across ranks (`shard`): how its statistics add up
    (see match/weight.py InMemoryPair): gloo all-reduces, each layer group's element broadcast by its owner."""

    lazy = True  # weight matching moves B's tensors one at a time

    @property
    def bytes_read(self) -> int:
        return self.blocks.bytes_read

    def reduce(self, x):
        if self.shard is None:
            return x
        import torch.distributed as dist

        t = x.clone() if isinstance(x, torch.Tensor) else torch.tensor(float(x), dtype=torch.float64)
        dist.all_reduce(t)
        return t if isinstance(x, torch.Tensor) else float(t)

    def reduce_max(self, x: float) -> float:
        if self.shard is None:
            return x
        import torch.distributed as dist

        t = torch.tensor(float(x), dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t)

    def share(self, elements: dict) -> None:
        if self.shard is None:
            return
        import torch.distributed as dist

        home = {n: i for i, blk in enumerate(self.blocks.blocks) for n in blk}
        for name, g in self.spec.groups.items():
            if not g.layer_local:
                continue
            owner = home[g.axes[0].param] % self.shard[1]
            for key in sorted(elements[name]):
                t = elements[name][key].contiguous()
                dist.broadcast(t, src=owner)
                elements[name][key] = t


class StreamedPair(_AcrossRanks):
    """Pieces of (A, B) for weight matching, A weighted as `weighting` and the token prior say (and as the
    anchor start's weighting says, when asked)."""

    def __init__(self, a: StreamedCheckpoint, b: StreamedCheckpoint, spec: Spec, dtype=torch.float64, *,
                 weighting: str = "sum", anchor_weighting: str | None = None, prior=None,
                 row_block_bytes: int | None = None, shard: tuple[int, int] | None = None):
        self.spec, self.shard = spec, shard
        self.blocks = Blocks([a, b], spec, dtype, row_block_bytes, shard)
        self.dtype = dtype
        self.weighting, self.anchor_weighting, self.prior = weighting, anchor_weighting or weighting, prior
        self.norms = self._norms() if "sum" != self.weighting or self.anchor_weighting != "sum" else None

    def _norms(self) -> tuple[dict, dict]:
        """||A_p||, ||B_p|| of the tensors in the spec's space, summed over row blocks (per-tensor weighting).
        Each rank needs only its own blocks' norms."""
        sq = ({}, {})
        for parts, _ in self.blocks():
            for acc, part in zip(sq, parts):
                for n, t in part.items():
                    acc[n] = acc.get(n, 0.0) + float(t.double().pow(2).sum())
        return tuple({n: math.sqrt(v) for n, v in acc.items()} for acc in sq)

    def pieces(self, names=None, anchor: bool = False):
        for (pa, pb), rows in self.blocks(names):
            ref = weighted_reference(pa, pb, self.weighting, self.prior, norms=self.norms, rows=rows)
            anchor_ref = (weighted_reference(pa, pb, self.anchor_weighting, self.prior, norms=self.norms, rows=rows)
                          if anchor else None)
            yield Piece(ref, pb, anchor_ref)
            pa = pb = ref = anchor_ref = None  # dropped before the next block is read


class MeanOfOthers(_AcrossRanks):
    """Pieces of (the mean of the other models, each moved by its current element; model `index`): MergeMany's
    re-alignment of one model, streamed. The models' blocks are read one model after another, each added to the
    mean as it is moved and dropped, so a piece holds the mean and model `index`'s block whatever the number of
    models; summed in the models' order as match/many.py sums them, so the target equals the in-memory one."""

    def __init__(self, cks: list[StreamedCheckpoint], spec: Spec, index: int, elements: list, dtype=torch.float64,
                 *, row_block_bytes: int | None = None, shard: tuple[int, int] | None = None):
        self.spec, self.shard, self.dtype = spec, shard, dtype
        self.blocks = Blocks(cks, spec, dtype, row_block_bytes, shard)  # checks the shapes; the blocks' layout
        self.each = [Blocks([ck], spec, dtype, row_block_bytes, shard) for ck in cks]
        self.index, self.elements = index, elements

    @property
    def bytes_read(self) -> int:
        return sum(b.bytes_read for b in self.each)

    def pieces(self, names=None, anchor: bool = False):
        streams = [blocks(names) for blocks in self.each]  # every model's blocks in the same order
        others = len(streams) - 1
        while True:
            target, pb = {}, None
            for k, stream in enumerate(streams):
                parts, _ = next(stream, (None, None))
                if parts is None:
                    return
                part = parts.pop()  # the list is ours (see Blocks): the piece goes as it is summed
                if k == self.index:
                    pb = part
                    continue
                view = Transformed(self.spec, part, self.elements[k])
                for n in list(part):
                    t = view[n]
                    del part[n]
                    target[n] = target[n] + t if n in target else t  # 0 + t0 + t1 ...: Python's sum, exactly
                    del t
                del part, view
            target = {n: t / others for n, t in target.items()}  # objective "sum": A as it is
            yield Piece(target, pb, target if anchor else None)
            pb = target = None
