"""`merge_many` on checkpoint paths: every model aligned to the first, or MergeMany's rounds against the mean of
the others, with the checkpoints streamed a block at a time (stream/pieces.py) and never held whole. The
alignments are the ones match/many.py finds for the same models in memory.

    als = lf.merge_many(["runs/s0", "runs/s1", "runs/s2"], "weight", dtype=torch.float32)
    merge_paths(["runs/s0", "runs/s1", "runs/s2"], "runs/merged", als)    # the aligned average
"""
from __future__ import annotations

from pathlib import Path

import torch

from ..errors import OutputError
from ..models.adapters import IncompatibleModelsError, check_compatible
from ..symmetry import Alignment
from ..symmetry.elements import elements_equal
from .merge_rounds import merge_rounds
from .pair import solved_alignment
from .weight import match_pieces


def merge_many_paths(paths, entry, *, mode: str, rounds: int, data, seed: int, dtype=None, out=None,
                     return_alignments: bool = False, progress: bool = False, distributed: bool | None = None):
    """See `merge_many`. Returns the alignments (alignments[i] maps model i onto the first, or onto the
    common mean in mode "mean"); with `out`, writes model i aligned to out/aligned_<i> (its format and
    dtype) and returns those folders, or (folders, alignments) with `return_alignments`."""
    from ..stream.checkpoint import StreamedCheckpoint
    from ..stream.paths import check_output
    from ..sweep.shard import shard_of

    if entry.stream is None:
        raise ValueError(f"method {entry.name!r} needs the models in memory: checkpoint paths stream with "
                         "'weight', 'permutation' and 'activation' (or load them with lmc_fast.io.load_model)")
    if distributed and "distributed" not in entry.runtime:
        raise ValueError(f"method {entry.name!r} runs in one process: distributed takes 'weight' or 'permutation'")
    cks = [StreamedCheckpoint(p) for p in paths]
    for i, ck in enumerate(cks[1:], start=1):
        check_compatible(cks[0].model, ck.model, f"models[{i}]", "models[0]", mlp="any")
        if ck.shapes != cks[0].shapes:  # in memory the narrower MLPs are zero-padded; on disk nothing is
            raise IncompatibleModelsError(f"models[{i}] has another MLP width than models[0]: checkpoint paths "
                                          "need equal widths (pad with lmc_fast.models.pad_mlp, or pass the models "
                                          "loaded: merge_many pads them in memory)")
    targets = None
    if out is not None:  # before any work: a folder (or none yet) whose entries overlap no input
        if Path(out).exists() and not Path(out).is_dir():
            raise OutputError(f"out: {out} exists and is not a folder")
        targets = [check_output(Path(out) / f"aligned_{i}", paths) for i in range(len(paths))]
    dtype = dtype or torch.float64
    options = {"dtype": dtype, "progress": progress}
    if entry.accepts("seed"):
        options["seed"] = seed
    if "distributed" in entry.runtime:
        options["distributed"] = distributed
    alignments = [None] + [entry.stream(paths[0], p, data if entry.needs_data else None, **options)
                           for p in paths[1:]]
    spec = alignments[1].spec
    alignments[0] = Alignment.identity(spec)
    alignments[0].info.update(streamed=True, fingerprint_b=alignments[1].info.get("fingerprint_a"))
    done_rounds = _mean_rounds(cks, spec, alignments, rounds, seed, dtype, shard_of(distributed), progress) \
        if mode == "mean" else 0
    for al in alignments:
        al.info["merge_rounds"] = done_rounds
    if targets is None:
        return alignments
    _write_aligned(alignments, paths, targets, distributed)
    return (targets, alignments) if return_alignments else targets


def _mean_rounds(cks, spec, alignments: list, rounds: int, seed: int, dtype, shard, progress: bool) -> int:
    """MergeMany in place (match/merge_rounds.py): model i re-aligned to the mean of the others as they are now,
    streamed (MeanOfOthers); a map counts unchanged within 1e-9 (1e-5 when solved in float32)."""
    from ..stream.pieces import MeanOfOthers

    atol = 1e-9 if dtype == torch.float64 else 1e-5

    def realign(i: int) -> bool:
        source = MeanOfOthers(cks, spec, i, [al.elements for al in alignments], dtype, shard=shard)
        elements, info = match_pieces(spec, source)  # weight_matching's defaults, as in memory
        info.update(weighting="sum", token_prior=False, streamed=True, mode="mean",
                    bytes_read=source.reduce(source.bytes_read), fingerprint_b=alignments[i].info.get("fingerprint_b"))
        if spec.space == "raw":
            info["method"] = "permutation"
        new = solved_alignment(spec, elements, info, dtype)
        changed = not elements_equal(spec, new.elements, alignments[i].elements, atol)
        alignments[i] = new
        return changed

    return merge_rounds(len(cks), rounds, seed, realign, progress, "merge_many (streamed)")


def _write_aligned(alignments, paths, targets, distributed) -> None:
    """Each aligned copy written atomically (a failure leaves the copies before it whole and no partial
    one); under torchrun rank 0 writes and the others wait for it."""
    from ..stream.paths import apply_to_path
    from ..sweep.shard import shard_of

    shard = shard_of(distributed)
    if shard is None or shard[0] == 0:
        for al, path, target in zip(alignments, paths, targets):
            apply_to_path(al, path, target)
    if shard is not None:
        import torch.distributed as dist

        dist.barrier()
