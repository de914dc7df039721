"""The streamed entry points on checkpoint paths: apply an alignment, merge, with outputs written tensor by
tensor (write.py). Matching two paths is `lf.align(path_a, path_b, "weight")` (match/streamed.py).

    al = lf.align("runs/a", "runs/b", "weight", dtype=torch.float32)     # a layer at a time
    apply_to_path(al, "runs/b", "runs/b-aligned")                        # B's format and dtype
    merge_paths(["runs/a", "runs/b"], "runs/merged", [None, al])         # the aligned average
"""
from __future__ import annotations

import os
from pathlib import Path


import torch

from ..errors import OutputError
from ..symmetry import Alignment, check_same_arch, spec_for
from ..symmetry.alignment import AlignmentMismatchError
from ..symmetry.elements import Transformed
from .checkpoint import StreamedCheckpoint
from .pieces import Blocks
from .write import write_checkpoint


def check_output(out, inputs) -> Path:
    """The output is none of the inputs, not inside one and does not hold one: refused before any work."""
    out = Path(out)
    real = Path(os.path.realpath(out))
    for p in inputs:
        q = Path(os.path.realpath(p))
        if real == q or q in real.parents or real in q.parents:
            raise OutputError(f"output {out} overlaps the input checkpoint {p}: write to another folder")
    if out.exists() and not out.is_dir():
        raise OutputError(f"{out} exists and is not a folder")
    return out


def _verified(al: Alignment, ck: StreamedCheckpoint, key: str, force: bool) -> None:
    recorded = al.info.get(key)
    if recorded is None or force:
        return
    got = ck.fingerprint()
    if got != recorded:
        raise AlignmentMismatchError(f"alignment was made for a model with fingerprint {recorded[:12]}, "
                                     f"{ck.path} has {got[:12]}: pass force=True to apply it anyway")


def _compute_dtype(out_dtype) -> torch.dtype:
    """float64 for float64 outputs; float32 for anything stored in 32 bits or less (each tensor is still
    brought to canonical form in float64: only the group action and the mixing run in float32)."""
    return torch.float64 if out_dtype == torch.float64 else torch.float32


def apply_to_path(alignment: Alignment, path_b, out, *, force: bool = False, dtype=None) -> Path:
    """g . B written to the folder `out`, tensor by tensor, in B's format and storage dtype (or `dtype`): the
    same function as B (in the alignment's space: canonical form for weight matching)."""
    alignment.validate()
    b = StreamedCheckpoint(path_b)
    out = check_output(out, [path_b])
    check_same_arch(alignment.spec.arch, b.arch)
    _verified(alignment, b, "fingerprint_b", force)
    blocks = Blocks([b], alignment.spec, _compute_dtype(dtype or b.dtype))

    def produce():
        for parts, rows in blocks():
            # transformed a tensor at a time as the writer reads it: no transformed copy of the whole block
            yield Transformed(alignment.spec, parts.pop(), alignment.elements), rows

    meta = {"aligned": {"method": alignment.info.get("method"), "space": alignment.spec.space,
                        "fingerprint_a": alignment.info.get("fingerprint_a"), "source": str(path_b)}}
    return write_checkpoint(out, b, produce, metadata=meta, dtype=dtype)


def merge_paths(paths, out, alignments=None, weights=None, *, force: bool = False, dtype=None) -> Path:
    """sum_i w_i g_i . model_i written to `out` in the first model's format and dtype, a block at a time:
    `alignments[i]` maps model i onto the first (None: as it is; all in one space), `weights` default
    uniform. With no alignment at all the raw parameters are averaged."""
    paths = list(paths)
    if len(paths) < 2:
        raise ValueError("merge_paths needs at least two checkpoints")
    alignments = list(alignments) if alignments is not None else [None] * len(paths)
    if len(alignments) != len(paths):
        raise ValueError(f"merge_paths: {len(alignments)} alignments for {len(paths)} checkpoints")
    weights = [1.0 / len(paths)] * len(paths) if weights is None else [float(w) for w in weights]
    if len(weights) != len(paths) or not all(w == w and abs(w) != float("inf") for w in weights):
        raise ValueError(f"merge_paths: weights must be {len(paths)} finite numbers, got {weights}")
    if abs(sum(weights) - 1.0) > 1e-9:
        raise ValueError(f"merge_paths: weights must sum to 1, got {sum(weights)}")
    cks = [StreamedCheckpoint(p) for p in paths]
    out = check_output(out, paths)
    spaces = {al.spec.space for al in alignments if al is not None}
    if len(spaces) > 1:
        raise ValueError("merge_paths: the alignments act on different spaces (canonical and raw)")
    spec = next((al.spec for al in alignments if al is not None), None) or spec_for(cks[0].arch, "raw")
    for ck, al in zip(cks, alignments):
        check_same_arch(spec.arch, ck.arch, str(ck.path))
        if al is not None:
            al.validate()
            _verified(al, ck, "fingerprint_b", force)
    blocks = Blocks(cks, spec, _compute_dtype(dtype or cks[0].dtype))

    def produce():
        # resident per block: the sum, one model's piece and one transformed tensor (each piece is
        # taken from the list and dropped as it is summed, each tensor as it is added)
        for parts, rows in blocks():
            mixed = {}
            for k, (al, w) in enumerate(zip(alignments, weights)):
                part, parts[k] = parts[k], None
                view = Transformed(al.spec, part, al.elements) if al is not None else part
                for n in list(part):
                    t = view[n]
                    del part[n]
                    if n in mixed:
                        mixed[n] += t * w
                    else:
                        mixed[n] = t * w
                    del t
                del part, view
            yield mixed, rows
            del mixed

    meta = {"merged": {"sources": [str(p) for p in paths], "weights": weights, "space": spec.space}}
    return write_checkpoint(out, cks[0], produce, metadata=meta, dtype=dtype)


__all__ = ["apply_to_path", "check_output", "merge_paths"]
