"""Experiment grids: seeds x methods x pairs in one command, resumable, across torchrun's ranks.

    import lmc_fast.grid
    lmc_fast.grid.run("bench/grids/digits_quick.toml", "grid_out")   # or a dict / GridSpec

    torchrun --standalone --nproc_per_node 2 -m lmc_fast.cli grid SPEC.toml --out DIR

Writes into `out`: results.jsonl (one record per (pair, method)), summary.csv / summary.md
(one row per method), barriers.png, curves.png, grid.json, the alignments under alignments/,
trained recipe models under models/, and one file per finished unit under units/ (what a
re-run after a kill reuses). See `spec` for the TOML format.
"""
from __future__ import annotations

from .report import markdown_table, summarise
from .runner import run
from .spec import GridSpec, load_spec, parse_spec
from .units import GRID_FORMAT, Unit, make_units

__all__ = ["GRID_FORMAT", "GridSpec", "Unit", "load_spec", "make_units", "markdown_table", "parse_spec", "run",
           "summarise"]
