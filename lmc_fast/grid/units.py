"""Units of work (one (pair, method) each, or one (simplex group, method)) and the keys that name
their results.

A key is a hash of everything that determines a unit's numbers: both models' fingerprints
(their weights, not their paths), the method and its options (and the library's values for what the
options leave unset, where the method says: learned matching's presets), the data spec and split, the
lambdas, the batching and the device kind, and GRID_FORMAT. A result stored under its key is
therefore reused exactly when recomputing it would give the same numbers: rename or reorder
checkpoints and nothing is recomputed; change one method's options and only its units are.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from ..match.methods import REGISTRY
from .spec import GridSpec

#: bump when a stored unit or alignment would no longer match what this code computes
GRID_FORMAT = 2  # 2: learned matching on language models starts from the token-prior weight matching
KEY_CHARS = 20


@dataclass(frozen=True)
class Unit:
    index: int  # position in results.jsonl
    models: tuple[int, ...]  # a pair (a, b), or a simplex group (the others aligned to the first)
    method: str  # the column: a registry method or a variant of one
    key: str  # the unit's result: OUT/units/<key>.json
    alignment_key: str | None  # pair units: the alignment applied, OUT/alignments/<key>.safetensors (None for "none")
    kind: str = "pair"  # "pair" | "simplex"
    alignment_keys: tuple = ()  # simplex units: one per model after the first (each a pair's alignment key)

    @property
    def pair(self) -> tuple[int, ...]:
        return self.models


def _hash(obj) -> str:
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:KEY_CHARS]


def alignment_key(spec: GridSpec, fp_a: str, fp_b: str, method: str) -> str | None:
    """What determines the alignment: models, the registry method and its options (a variant with
    the same options as another column shares its alignment), and the matching data if it reads any."""
    base = spec.base(method)
    m = REGISTRY[base]
    if not m.aligns:
        return None
    match = ({"data": spec.data, "batch_size": spec.match_batch_size, "max_batches": spec.match_max_batches,
              "block_size": spec.block_size} if m.needs_data else None)
    options = spec.options.get(method, {})
    # what the options leave to the library (a preset's values) is keyed too, where the method says what it is
    settings = {} if m.settings is None else {"settings": m.settings(options)}
    return _hash({"format": GRID_FORMAT, "kind": "alignment", "a": fp_a, "b": fp_b, "method": base,
                  "options": options, "match": match, "device": spec.device, **settings})


def unit_key(spec: GridSpec, fp_a: str, fp_b: str, method: str) -> str:
    """The alignment's key plus what the sweep reads: split, lambdas, batching."""
    return _hash({"format": GRID_FORMAT, "kind": "unit", "a": fp_a, "b": fp_b, "method": spec.base(method),
                  "alignment": alignment_key(spec, fp_a, fp_b, method), "data": spec.data, "split": spec.split,
                  "lambdas": list(spec.lambdas), "batch_size": spec.batch_size, "max_batches": spec.max_batches,
                  "block_size": spec.block_size, "device": spec.device})


def simplex_key(spec: GridSpec, fps: list[str], method: str, alignments: list) -> str:
    """The group's models (in order: the first is the reference), each alignment, and what the sweep reads."""
    return _hash({"format": GRID_FORMAT, "kind": "simplex", "models": fps, "method": spec.base(method),
                  "alignments": alignments, "data": spec.data, "split": spec.split,
                  "samples": spec.simplex_samples, "alpha": spec.simplex_alpha, "seed": spec.simplex_seed,
                  "batch_size": spec.batch_size, "max_batches": spec.max_batches, "block_size": spec.block_size,
                  "device": spec.device})


def make_units(spec: GridSpec, fingerprints: list[str]) -> list[Unit]:
    """Every (pair, method) in results order: pairs outer, methods inner (a pair's units share its models);
    then every (simplex group, method)."""
    units = []
    for i, j in spec.pairs:
        for method in spec.methods:
            units.append(Unit(len(units), (i, j), method, unit_key(spec, fingerprints[i], fingerprints[j], method),
                              alignment_key(spec, fingerprints[i], fingerprints[j], method)))
    for group in spec.simplex_groups:
        ref = fingerprints[group[0]]
        for method in spec.simplex_methods:
            keys = [alignment_key(spec, ref, fingerprints[k], method) for k in group[1:]]
            units.append(Unit(len(units), tuple(group), method,
                              simplex_key(spec, [fingerprints[k] for k in group], method, keys), None,
                              kind="simplex", alignment_keys=tuple(keys)))
    return units


def my_units(units: list[Unit], rank: int, world: int) -> list[Unit]:
    """This rank's share: dealt round-robin method by method (each rank gets its part of every method, so
    a costly method does not land on one rank), then run in results order (a pair's units share models)."""
    order = {(kind, m): k for k, (kind, m) in enumerate(dict.fromkeys((u.kind, u.method) for u in units))}
    dealt = sorted(units, key=lambda u: (order[(u.kind, u.method)], u.index))[rank::world]
    return sorted(dealt, key=lambda u: u.index)


__all__ = ["GRID_FORMAT", "Unit", "alignment_key", "make_units", "my_units", "simplex_key", "unit_key"]
