"""`lmc-fast grid`: every (pair, method) of a TOML spec, resumable, across torchrun's ranks."""
from __future__ import annotations

import argparse
from pathlib import Path

from .args import add_command, thread_count
from .console import Console


def register(subparsers, parents):
    # Not the common options: the device and the matching seeds belong to the spec ([grid] device,
    # [methods.NAME] seed), so one spec file is the whole experiment.
    del parents
    g = add_command(subparsers, "grid",
                    "seeds x methods x pairs from a TOML spec: results.jsonl, summary.csv/.md, plots; "
                    "resumes after a kill; under torchrun the units are split across ranks", [])
    g.add_argument("spec", help="the grid's TOML file ([data], [models], [grid], [methods.NAME]; "
                                "see lmc_fast/grid/spec.py)")
    g.add_argument("--out", required=True, help="output folder (its units/ and alignments/ are what a re-run reuses)")
    g.add_argument("--resume", action=argparse.BooleanOptionalAction, default=True,
                   help="reuse finished units and alignments found in --out (--no-resume recomputes all)")
    g.add_argument("--profile", default=None, metavar="DIR",
                   help="write a torch.profiler Chrome trace of one unit (rank 0's first that aligns) into DIR "
                        "(default: no trace)")
    g.add_argument("-q", "--quiet", action="store_true", help="no log lines (the summary table only)")
    g.add_argument("--threads", type=thread_count, default=None,
                   help="torch CPU threads per process (default: torch's; torchrun sets 1 per rank)")


def run(args, con: Console) -> int:
    from ..grid import load_spec, markdown_table
    from ..grid import run as run_grid

    spec = load_spec(args.spec)  # a bad spec fails before torch loads, naming its key
    result = run_grid(spec, Path(args.out), resume=args.resume, log=con.log, profile=args.profile,
                      inputs=(args.spec,))
    if result["rank"] == 0:
        con.out(markdown_table(result["summary"]).rstrip())
        if result.get("simplex_summary"):
            from ..grid.report import simplex_markdown_table

            con.out(simplex_markdown_table(result["simplex_summary"]).rstrip())
        con.out(f"{len(result['records'])} records ({result['reused']} reused) -> {Path(args.out) / 'results.jsonl'}")
    return 0
