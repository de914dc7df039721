"""Learned matching against its budget: the test barrier after N steps, and the seconds it took, per Table 1 setting.

Each budget is its own run (its own cosine schedule and early stopping), with Table 1's learned settings
otherwise; `--match-batch-size` and `--lr` change one of them for every budget (what buys more steps
per second, or takes larger ones). The goal the budget is read against: median barrier <= 0.02 over the
pairs, within 60 s of one core per pair.

    python bench/learned_budget.py spec digits --steps 100 300 1000 --out /tmp/lb/digits.toml
    cp -r /tmp/lmc_grids/ls_digits/models /tmp/lmc_grids/lb_digits/   # the same trained models (cached)
    torchrun --standalone --nproc_per_node 2 -m lmc_fast.cli grid /tmp/lb/digits.toml --out /tmp/lmc_grids/lb_digits
    python bench/learned_budget.py table digits=/tmp/lmc_grids/lb_digits ...

`table` writes bench/results/learned_budget.{json,md} and a plot of barrier against seconds.
"""
from __future__ import annotations

import argparse
import os
import sys
import tomllib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import cpu_model, write_study  # noqa: E402
from learned_subsets import (GRIDS, RESULTS, SETTINGS, _fmt, _stats, cpu_capability, read_grid,  # noqa: E402
                             solve_seconds, to_toml)

GOAL = 0.02
BUDGET_SECONDS = 60.0


def method_name(steps: int, batch: int | None, lr: float | None) -> str:
    # (grid variant names take letters, digits, - and _: 0.02 is written 0p02)
    return f"learned-{steps}" + (f"-b{batch}" if batch else "") + (f"-lr{lr:g}".replace(".", "p") if lr else "")


def derived_spec(setting: str, steps: list[int], batch: int | None, lr: float | None) -> dict:
    spec = tomllib.loads((GRIDS / f"table1_{setting}.toml").read_text())
    learned = dict(spec["methods"]["learned"])
    if lr:
        learned["lr"] = lr
    if batch:  # the same training examples, in batches of another size (the grid's default is 64)
        old = spec["data"].get("match_batch_size", 64)
        spec["data"]["match_batch_size"] = batch
        if "match_max_batches" in spec["data"]:
            spec["data"]["match_max_batches"] = spec["data"]["match_max_batches"] * old // batch
    spec["methods"] = {method_name(n, batch, lr): {"method": "learned", **learned, "steps": n,
                                                   # ten evaluations a run (at least every 10 steps)
                                                   "eval_every": max(10, n // 10)}
                       for n in steps}
    spec["grid"]["methods"] = list(spec["methods"])
    spec.pop("simplex", None)
    return spec


def summarise(folder: Path) -> dict:
    units = read_grid(folder)
    rows = {}
    for method, by_pair in units.items():
        if not method.startswith("learned-"):
            continue
        pairs = sorted(by_pair)
        recs = [by_pair[p] for p in pairs]
        rows[method] = {"pairs": [list(p) for p in pairs], "steps": recs[0]["options"]["steps"],
                        "barrier": _stats([r["barrier"] for r in recs]),
                        "seconds": _stats([solve_seconds(r) for r in recs]),
                        "steps_taken": _stats([r["info"]["steps"] for r in recs]),
                        "val_history": [r["info"]["val_history"] for r in recs]}
    return rows


def markdown(results: dict) -> str:
    out = [f"Learned matching per budget: test loss barrier and seconds of one core per pair, median [min, max] "
           f"(goal: median <= {GOAL} within {BUDGET_SECONDS:.0f} s):", "",
           "| setting | run | pairs | steps taken | seconds | barrier | goal met |",
           "|---|---|---:|---:|---:|---:|---|"]
    for setting, rows in results.items():
        for method, r in sorted(rows.items(), key=lambda kv: kv[1]["seconds"]["median"]):
            met = r["barrier"]["median"] <= GOAL
            within = r["seconds"]["median"] <= BUDGET_SECONDS
            out.append(f"| {SETTINGS.get(setting, setting)} | {method} | {len(r['pairs'])} | "
                       f"{_fmt(r['steps_taken'], 0)} | {_fmt(r['seconds'], 0)} | {_fmt(r['barrier'])} | "
                       f"{'yes' if met and within else ('barrier only' if met else 'no')} |")
    return "\n".join(out) + "\n"


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for setting, rows in results.items():
        pts = sorted((r["seconds"]["median"], r["barrier"]["median"], r["barrier"]["min"], r["barrier"]["max"])
                     for r in rows.values())
        xs, ys, lo, hi = zip(*pts)
        line, = ax.plot(xs, ys, "o-", label=SETTINGS.get(setting, setting))
        ax.vlines(xs, lo, hi, color=line.get_color(), alpha=0.4)
    ax.axhline(GOAL, color="k", ls="--", lw=0.8)
    ax.axvline(BUDGET_SECONDS, color="k", ls=":", lw=0.8)
    ax.set(xscale="log", yscale="log", xlabel="seconds of learned matching per pair (one core)",
           ylabel="test loss barrier (median, range)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sp = sub.add_parser("spec", help="write the derived grid spec")
    sp.add_argument("setting", choices=sorted(SETTINGS))
    sp.add_argument("--steps", type=int, nargs="+", required=True)
    sp.add_argument("--match-batch-size", type=int)
    sp.add_argument("--lr", type=float)
    sp.add_argument("--out", required=True)
    tp = sub.add_parser("table", help="summarise finished grids")
    tp.add_argument("grids", nargs="+", metavar="SETTING=FOLDER", help="a setting may be named more than once")
    tp.add_argument("--out", default=str(RESULTS / "learned_budget"))
    args = p.parse_args()
    if args.cmd == "spec":
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        spec = derived_spec(args.setting, args.steps, args.match_batch_size, args.lr)
        Path(args.out).write_text(f"# derived from bench/grids/table1_{args.setting}.toml by bench/learned_budget.py\n"
                                  + to_toml(spec))
        print(f"-> {args.out}")
        return
    results: dict = {}
    for g in args.grids:
        setting, _, folder = g.partition("=")
        results.setdefault(setting, {}).update(summarise(Path(folder)))
    record = {"kind": "learned_budget", "machine": cpu_model(), "cpu_capability": cpu_capability(),
              "grids": args.grids, "load_average": os.getloadavg(), "goal": GOAL,
              "budget_seconds": BUDGET_SECONDS, "settings": results}
    out = write_study(args.out, record, markdown(results))
    plot(results, out.with_suffix(".png"))
    print(f"-> {out}.json, {out}.md, {out}.png")


if __name__ == "__main__":
    main()
