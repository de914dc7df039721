"""`lmc-fast instability`: instability analysis of a recipe (see `lmc_fast.instability`).

    lmc-fast instability --model gpt2 --data shakespeare --spawn-steps 0 50 100 200 --copies 2 --steps 400

A command module like those of `lmc_fast.cli`: `register(subparsers, parents)` adds the
subparser, `run(args, console) -> int` runs it. Nothing here imports torch until `run`.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from ..method_names import DATA_FREE_METHODS as METHODS  # torch-free names of the registry's data-free methods

from ..recipe_names import RECIPE_DATA, RECIPE_DATASETS as DATA, RECIPE_MODELS as MODELS  # recipe = MODEL-DATA


def _int_at_least(low: int, rule: str):
    def parse(text: str) -> int:
        try:
            value = int(text, 10)
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(f"{rule}, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{rule}, got {text!r}")
        return value

    return parse


def register(subparsers, parents):
    from .args import add_command, lambda_value

    q = add_command(subparsers, "instability",
                    "instability analysis (Frankle et al. 2020): train to each spawn step, fork copies that continue "
                    "on other data orders, report the barrier of every pair raw and after weight matching", parents)
    q.add_argument("--model", choices=MODELS, default="gpt2", help="architecture")
    q.add_argument("--data", choices=DATA, default="shakespeare",
                   help=f"recipe data (the recipes: {', '.join(RECIPE_DATA)})")
    q.add_argument("--spawn-steps", type=_int_at_least(0, "must be an integer >= 0"), nargs="+",
                   default=[0, 50, 100, 200], metavar="K",
                   help="steps at which copies fork from the parent (each below --steps)")
    q.add_argument("--copies", type=_int_at_least(2, "must be an integer >= 2 (pairs are compared)"), default=2,
                   help="copies per spawn step; every pair is measured")
    q.add_argument("--steps", type=_int_at_least(1, "must be a positive integer"), default=None,
                   help="total training steps of every run (default: the recipe's)")
    q.add_argument("--methods", choices=METHODS, nargs="+", default=["none", "weight"],
                   help="alignments measured per pair ('none': raw parameters)")
    q.add_argument("--lambdas", type=lambda_value, nargs="+", default=[11],
                   help="points on each path: a count, or several values in [0, 1]")
    q.add_argument("--eval-batches", type=_int_at_least(1, "must be a positive integer"), default=4,
                   help="test batches (the recipe's eval batch size) per barrier")
    q.add_argument("--out", default="instability_out",
                   help="output folder: trained units (reused by a re-run), instability.json, instability.png")


def _recipe_name(args) -> str:
    from .console import CLIError
    from ..recipe_names import recipe_for

    name = recipe_for(args.model, args.data)
    if name is None:
        raise CLIError(f"--model {args.model} --data {args.data}: no such recipe; recipes: {', '.join(RECIPE_DATA)}")
    return name


def run(args, console) -> int:
    from .args import lambda_grid
    from .console import CLIError
    from .outputs import Outputs

    if len(set(args.spawn_steps)) != len(args.spawn_steps):
        raise CLIError(f"--spawn-steps {' '.join(map(str, args.spawn_steps))}: a step is given twice")
    if len(set(args.methods)) != len(args.methods):
        raise CLIError(f"--methods {' '.join(args.methods)}: a method is given twice")
    lambdas = lambda_grid(args.lambdas)
    name = _recipe_name(args)
    out = Path(args.out)
    outputs = Outputs()
    outputs.into("--out", out)
    outputs.file("--out", out / "instability.json")
    outputs.file("--out", out / "instability.png")
    outputs.check()

    from ..instability import format_table, instability, total_steps
    from ..recipes import recipe

    r = recipe(name)
    total = args.steps if args.steps is not None else total_steps(r)  # missing data: an OSError, one line
    late = [k for k in args.spawn_steps if k >= total]
    if late:
        whose = "--steps" if args.steps is not None else "the recipe's; set --steps to change it"
        raise CLIError(f"--spawn-steps {' '.join(map(str, late))}: must be below the total steps ({total}, {whose})")
    console.log(f"instability: recipe {name}, {total} steps, spawn steps {sorted(args.spawn_steps)}, "
                f"{args.copies} copies, methods {' '.join(args.methods)} -> {out}")
    result = instability(r, out, spawn_steps=args.spawn_steps, copies=args.copies, steps=total,
                         seed=getattr(args, "seed", 0), lambdas=lambdas, eval_batches=args.eval_batches,
                         methods=args.methods, device=getattr(args, "device", "cpu"), log=console.log)
    console.out(format_table(result))
    console.out(f"results: {result['json_path']}; plot: {result['plot_path']}")
    return 0


__all__ = ["register", "run"]
