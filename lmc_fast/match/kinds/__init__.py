"""How each kind of symmetry group is matched: one matcher per kind, one file each.

A kind's algebra (what an element is, how it acts) is its class in symmetry/groups.py; its
matching is the matcher here (base.py says what one holds): weight matching's statistic, the
same statistic from activations, the batched solver, and the latent learned matching trains.
Weight, activation and learned matching are loops over a spec that call these and never ask a
group's kind, so a new kind of symmetry is its algebra class plus one matcher file registered here.
"""
from __future__ import annotations

from .base import Matcher
from .heads import HeadsMatcher
from .orthogonal import OrthogonalMatcher
from .permutation import PermutationMatcher

#: group.kind -> its matcher
MATCHERS: dict[str, Matcher] = {m.kind: m for m in (PermutationMatcher(), OrthogonalMatcher(), HeadsMatcher())}


def matcher_of(group) -> Matcher:
    return MATCHERS[group.kind]


def batches(spec, names) -> list[tuple[Matcher, list[str]]]:
    """The named groups in runs that one batched solve takes (same kind and batch key), in order."""
    runs: dict = {}
    for n in names:
        g = spec.groups[n]
        m = matcher_of(g)
        runs.setdefault((g.kind, m.batch_key(g)), (m, []))[1].append(n)
    return list(runs.values())


def solve_groups(spec, names, stats: dict, elements: dict, *, warm: dict | None = None, frozen: bool = False) -> None:
    """Solve the named groups from their statistics into `elements`, one batched call per run.
    `frozen`: the discrete parts (permutations) of the current elements stay; only maps move."""
    for m, same in batches(spec, names):
        groups = [spec.groups[n] for n in same]
        current = [elements[n] for n in same] if frozen else None
        solved = m.solve(groups, [stats[n] for n in same], warm=warm, key=tuple(same), current=current)
        elements.update(zip(same, solved))


__all__ = ["MATCHERS", "Matcher", "batches", "matcher_of", "solve_groups"]
