"""MergeMany's schedule, shared by the in-memory and the streamed merge_many: rounds in which every model, in
an order shuffled by `seed`, is re-aligned to the mean of the others, until a round changes nothing."""
from __future__ import annotations

import random


def merge_rounds(n: int, rounds: int, seed: int, realign, progress: bool = False, desc: str = "merge_many") -> int:
    """Run `realign(i)` (re-align model i; returns whether its element changed) for every model each round, at
    most `rounds` rounds; returns how many ran."""
    rng = random.Random(seed)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=rounds, desc=desc)
    done = 0
    for done in range(1, rounds + 1):
        order = list(range(n))
        rng.shuffle(order)
        changed = [realign(i) for i in order]  # every model, even after one has changed
        if bar is not None:
            bar.update(1)
        if not any(changed):
            break
    if bar is not None:
        bar.close()
    return done
