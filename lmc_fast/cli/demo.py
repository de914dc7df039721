"""`lmc-fast demo`: train two ViTs, align with every method, table + plot."""
from __future__ import annotations

from pathlib import Path

from .args import add_command, finite_positive_float, lambda_count, positive_int
from .console import Console
from .outputs import Outputs


def register(subparsers, parents):
    d = add_command(subparsers, "demo", "train two ViTs, align with every method, table + plot", parents)
    d.add_argument("--out", default="demo_out", help="output folder")
    d.add_argument("--data", default="digits", choices=["digits", "fashion-mnist"], help="the demo's data")
    d.add_argument("--quick", action="store_true",
                   help="tiny, barely trained models (seconds; checks the set-up, the numbers mean nothing)")
    d.add_argument("--learned-steps", type=positive_int, default=None,
                   help="learned-matching steps (default on CPU 2000 for digits, 300 for fashion-mnist; 3000 on CUDA; quick 10)")
    d.add_argument("--epochs", type=finite_positive_float, default=None,
                   help="training epochs (default 40 on digits, the recipe's on fashion-mnist; quick 2)")
    d.add_argument("--lambdas", type=lambda_count, default=None, help="points on each path (default 25; quick 9)")


def run(args, con: Console) -> int:
    from ..demo import QUICK_NOTE, demo_outputs, format_table, run_demo

    out = Path(args.out)
    outputs = Outputs()
    outputs.into("--out", out)
    for kind, path in demo_outputs(out):
        (outputs.folder if kind == "folder" else outputs.file)("--out", path)
    outputs.check()
    res = run_demo(args.out, data=args.data, device=args.device, quick=args.quick, learned_steps=args.learned_steps,
                   lambdas=args.lambdas, epochs=args.epochs, progress=not args.quiet, log=con.log)
    m = res["machine"]
    con.out("")
    if args.quick:
        con.out(QUICK_NOTE)
    con.out(f"two ViTs on {res['data']} (seeds {res['seeds'][0]} and {res['seeds'][1]}; test accuracy "
            f"{100 * res['end_points']['acc_a']:.1f}% / {100 * res['end_points']['acc_b']:.1f}%), "
            f"{res['lambdas']} lambdas on {res['test_examples']} test images")
    con.out(format_table(res["table"]))
    con.out(f"{m['cpu']}, {m['cores']} cores, torch {m['torch']}, {m['device']}" + (f" ({m['gpu']})" if "gpu" in m else "")
            + f"; total {res['total_seconds']:.0f} s")
    con.out(f"results -> {out / 'results.json'}, curves -> {out / 'curves.png'}")
    return 0
