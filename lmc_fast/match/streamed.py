"""Weight and permutation matching of two checkpoints on disk, streamed: the structured sweeps of
match/weight.py over pieces read a block at a time (stream/pieces.py), so memory is one block of each
model plus the groups' statistics, whatever the models' size. Same elements as in memory."""
from __future__ import annotations

import torch

from ..models.adapters import check_compatible
from ..symmetry import spec_for
from .pair import progress_bar, solved_alignment
from .weight import INITS, match_pieces
from .weighting import token_weights


def align_streamed(path_a, path_b, space: str, heads: bool = True, *, dtype=None, progress: bool = False,
                   seed: int = 0, max_iter: int = 100, tol: float = 1e-4, order: str = "structured",
                   weighting: str | None = None, token_counts=None, init: str = "anchor", polish_iter: int = 10,
                   distributed: bool | None = None):
    """The alignment of checkpoint `path_b` onto `path_a` (folders or files `load_model` reads).

    Inside a torch.distributed group of several ranks (torchrun), or with `distributed=True`, the layers are
    split across the ranks (rank r takes blocks r, r + world, ...): each solves its layers' groups, the
    residual's statistics are all-reduced and every rank returns the whole alignment. Call it on every rank."""
    from ..sweep.shard import shard_of
    from ..stream.checkpoint import StreamedCheckpoint
    from ..stream.pieces import StreamedPair

    if order != "structured":
        raise ValueError(f"order={order!r} needs both models in memory; a streamed match runs order='structured'")
    if init not in INITS:
        raise ValueError(f"init must be one of {INITS}, got {init!r}")
    a, b = StreamedCheckpoint(path_a), StreamedCheckpoint(path_b)
    check_compatible(a.model, b.model, mlp="equal")
    dtype = dtype or torch.float64
    spec = spec_for(a.arch, space, heads=heads)
    weighting = weighting or "sum"
    prior = None
    if token_counts is not None:
        if "tok_embed.weight" not in a.shapes:
            raise ValueError("token_counts needs a language model (no tok_embed.weight among its parameters)")
        prior = token_weights(token_counts, a.shapes["tok_embed.weight"][0])
    shard = shard_of(distributed)
    pair = StreamedPair(a, b, spec, dtype, weighting=weighting, prior=prior, shard=shard,
                        anchor_weighting="per_tensor" if init == "anchor_per_tensor" else weighting)
    bar = progress_bar(progress, "weight matching (streamed)", max_iter)
    elements, info = match_pieces(spec, pair, max_iter=max_iter, tol=tol, init=init, polish_iter=polish_iter,
                                  progress=bar)
    if bar is not None:
        bar.close()
    info.update(weighting=weighting, token_prior=prior is not None, streamed=True,
                bytes_read=pair.reduce(pair.blocks.bytes_read), bytes_read_here=pair.blocks.bytes_read,
                ranks=1 if shard is None else shard[1], fingerprint_a=a.fingerprint(), fingerprint_b=b.fingerprint())
    if space == "raw":
        info["method"], info["heads"] = "permutation", heads
    return solved_alignment(spec, elements, info, dtype)


def streamed_by_weights(path_a, path_b, data=None, *, seed: int = 0, **options):
    """Method "weight" on two checkpoint paths."""
    return align_streamed(path_a, path_b, "canonical", seed=seed, **options)


def streamed_by_permutations(path_a, path_b, data=None, *, heads: bool | None = True, **options):
    """Method "permutation" on two checkpoint paths."""
    return align_streamed(path_a, path_b, "raw", heads is not False, **options)


def _layer_of(name: str):
    head, _, tail = name.partition(".")
    return int(tail) if head in ("mlp", "heads", "inner", "state") and tail.isdigit() else None  # Mamba: inner, state


@torch.no_grad()
def streamed_by_activations(path_a, path_b, data, *, dtype=None, progress: bool = False,
                            max_batches: int | None = None, residual_only: bool = False, distributed=None):
    """Method "activation" on two checkpoint paths: both models carried through every batch together a
    layer at a time (stream/forward.py), each layer's groups' statistics summed as its activations pass,
    the residual's over every block boundary; then the solvers of match/activation.py. With
    `residual_only` the layer groups come from streamed weight matching given the residual's element."""
    from ..stream.checkpoint import StreamedCheckpoint
    from ..stream.forward import LayerForward, collect_batches
    from ..stream.pieces import Blocks, StreamedPair
    from ..models import functional as Fn
    from ..sweep.batches import reiterable
    from ..sweep.checks import spec_from_model
    from ..symmetry.elements import apply_spec, identity
    from .kinds import matcher_of, solve_groups
    from .weight import solve_layer_groups

    if distributed:
        raise ValueError("streamed activation matching runs in one process (distributed: weight / permutation)")
    import time

    t0 = time.perf_counter()
    a, b = StreamedCheckpoint(path_a), StreamedCheckpoint(path_b)
    check_compatible(a.model, b.model, mlp="equal")
    dtype = dtype or torch.float64
    spec = spec_for(a.arch, "canonical")
    arch = spec.arch
    batches = collect_batches(reiterable(data), spec_from_model(a.model), max_batches)
    fwd = LayerForward(Blocks([a, b], spec, dtype), batches)
    names = [spec.residual] if residual_only and spec.residual is not None else list(spec.groups)
    sums = {}

    def add(rec_a, rec_b, which):
        for name in which:
            g = spec.groups[name]
            term = matcher_of(g).activation_term(g, rec_a, rec_b)
            if term is None:
                continue
            old = sums.get(name)
            if old is None:
                sums[name] = term
            elif isinstance(term, dict):
                sums[name] = {k: (None if v is None else old[k] + v) for k, v in term.items()}
            else:
                sums[name] = old + term

    def ops(*stores):
        merged = {}
        for st in stores:
            merged.update(st)
        return Fn.StackedOps(arch, {k: v.unsqueeze(0) for k, v in merged.items()})

    outer = [ops(fwd.outer[i]) for i in range(2)]
    hs = [[Fn.embed_norm(arch, outer[i], fwd.embedded(i, x).to(dtype)) for i in range(2)] for x, _ in batches]
    tokens = sum(h[0].shape[1:-1].numel() for h in hs)  # positions of the stream, as CrossStats counts them
    residual = [spec.residual] if spec.residual in names else []
    for l in range(arch.n_layer):
        layer = fwd.layer(l)
        lops = [ops(layer[i]) for i in range(2)]
        here = [n for n in names if _layer_of(n) == l] + residual
        for h in hs:
            recs = ({}, {})
            for i in range(2):
                h[i] = Fn.block(arch, lops[i], l, h[i], record=recs[i].__setitem__)
            add(*recs, here)
        layer = lops = None
    rest = [n for n in names if _layer_of(n) is None and n != spec.residual]
    for h in hs:  # the last block boundary, and the head's own groups (BERT's pooler, transform)
        recs = ({f"resid.{arch.n_layer}": h[0]}, {f"resid.{arch.n_layer}": h[1]})
        if rest:
            for i in range(2):
                Fn.head(arch, outer[i], h[i], record=recs[i].__setitem__)
        add(*recs, residual + rest)
    elements = {}
    solve_groups(spec, names, sums, elements)
    info = {"method": "activation", "tokens": tokens, "streamed": True, "bytes_read": fwd.blocks.bytes_read}
    if residual_only:
        local = [n for n in spec.groups if n not in names]
        elements.update({n: identity(spec.groups[n], dtype) for n in local})
        pair = StreamedPair(a, b, spec, dtype)
        for piece in pair.pieces():
            here = [n for n in local if spec.groups[n].axes[0].param in piece.a]
            if here:
                solve_layer_groups(spec, piece.a, apply_spec(spec, piece.b, elements, skip=set(local)), elements,
                                   here)
            piece = None
        info["residual_only"] = True
        info["bytes_read"] += pair.blocks.bytes_read
    info.update(seconds=time.perf_counter() - t0, fingerprint_a=a.fingerprint(), fingerprint_b=b.fingerprint())
    return solved_alignment(spec, elements, info, dtype)
