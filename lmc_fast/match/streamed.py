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


def streamed_by_weights(path_a, path_b, *, seed: int = 0, **options):
    """Method "weight" on two checkpoint paths."""
    return align_streamed(path_a, path_b, "canonical", seed=seed, **options)


def streamed_by_permutations(path_a, path_b, *, heads: bool | None = True, **options):
    """Method "permutation" on two checkpoint paths."""
    return align_streamed(path_a, path_b, "raw", heads is not False, **options)
