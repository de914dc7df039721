"""Where a piece of GPU work waits for the host: torch's sync debug mode, with call sites.

`host_syncs(fn)` runs fn() once with `torch.cuda.set_sync_debug_mode("warn")` and returns, for each
synchronising CUDA operation, the stack of lmc_fast frames (innermost first) that issued it, so a
test can say which syncs a step may have (a learned-matching step: the assignment's copies only).
torch calls the mode a prototype that does not yet see every synchronising operation: an empty
list is necessary, not sufficient.
"""
from __future__ import annotations

import traceback
import warnings
from pathlib import Path

import torch

__all__ = ["host_syncs"]


def host_syncs(fn, match=("lmc_fast",)) -> list[list[str]]:
    """Run fn() once on CUDA; per synchronising operation, ["file.py:line", ...] of the frames whose
    path contains one of `match`, innermost first."""
    sites = []

    def show(message, *args, **kwargs):
        if "synchroniz" in str(message):
            frames = [f for f in traceback.extract_stack()[:-1] if any(m in f.filename for m in match)]
            sites.append([f"{Path(f.filename).name}:{f.lineno}" for f in frames[::-1]])

    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = show
            fn()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return sites
