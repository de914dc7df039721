"""Learned matching against its budget: the test barrier after N steps, and the seconds it took, per Table 1 setting.

Each budget is its own run (its own cosine schedule and early stopping), with Table 1's learned settings
otherwise; `--match-batch-size`, `--lr` and `--set KEY=VALUE` (any learned-matching option:
temperature, lambdas_per_step, augment, warmup, ...) change them for every budget of the spec. The goal
the budget is read against: median barrier <= 0.02 over the pairs, within 60 s of one core per pair.

    python bench/learned_budget.py spec digits --steps 100 300 1000 --out /tmp/lb/digits.toml
    cp -r /tmp/lmc_grids/ls_digits/models /tmp/lmc_grids/lb_digits/   # the same trained models (cached)
    torchrun --standalone --nproc_per_node 2 -m lmc_fast.cli grid /tmp/lb/digits.toml --out /tmp/lmc_grids/lb_digits
    python bench/learned_budget.py table digits=/tmp/lmc_grids/lb_digits ...

`table` writes bench/results/learned_budget.{json,md} (or `--out`) and a plot of barrier against seconds;
each row names the settings it changed from Table 1's learned column.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import sys
import textwrap
import tomllib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import cpu_model, write_study  # noqa: E402
from learned_subsets import (GRIDS, RESULTS, SETTINGS, _fmt, _stats, cpu_capability, read_grid,  # noqa: E402
                             solve_seconds, to_toml)

GOAL = 0.02
BUDGET_SECONDS = 60.0


#: options a budget's own run sets (not a change of Table 1's settings)
RUN_OPTIONS = ("steps", "eval_every", "method")


def option_value(text: str):
    """A --set value as TOML would read it: a whole number, a number, true/false, else the string."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text, text)


def parse_sets(items: list[str]) -> dict:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--set takes KEY=VALUE, got {item!r}")
        out[key] = option_value(value)
    return out


def _name_part(value) -> str:
    # (grid variant names take letters, digits, - and _: 0.02 is written 0p02)
    return (f"{value:g}" if isinstance(value, float) else str(value)).replace(".", "p").replace("-", "m")


def method_name(steps: int, batch: int | None, lr: float | None, sets: dict | None = None) -> str:
    return (f"learned-{steps}" + (f"-b{batch}" if batch else "") + (f"-lr{_name_part(lr)}" if lr else "")
            + "".join(f"-{k}{_name_part(v)}" for k, v in (sets or {}).items()))


def derived_spec(setting: str, steps: list[int], batch: int | None, lr: float | None,
                 sets: dict | None = None) -> dict:
    spec = tomllib.loads((GRIDS / f"table1_{setting}.toml").read_text())
    learned = dict(spec["methods"]["learned"])
    if lr:
        learned["lr"] = lr
    learned.update(sets or {})
    if batch:  # the same training examples, in batches of another size (the grid's default is 64)
        old = spec["data"].get("match_batch_size", 64)
        spec["data"]["match_batch_size"] = batch
        if "match_max_batches" in spec["data"]:
            spec["data"]["match_max_batches"] = spec["data"]["match_max_batches"] * old // batch
    spec["methods"] = {method_name(n, batch, lr, sets): {"method": "learned", **learned, "steps": n,
                                                   # ten evaluations a run (at least every 10 steps)
                                                   "eval_every": max(10, n // 10)}
                       for n in steps}
    spec["grid"]["methods"] = list(spec["methods"])
    spec.pop("simplex", None)
    return spec


def effective(options: dict) -> dict:
    """`options` with the preset's name replaced by the settings it gives them, where that does not depend on
    the preset: a column that names every setting a preset fills (or whose preset is named) ran with them,
    whatever the default was on its day, so two columns differ by their settings, not by how they were named."""
    from lmc_fast.match.learned import PRESETS, preset_settings

    given = {k: options[k] for k in PRESETS["paper"] if k in options}
    names = [options["preset"]] if options.get("preset", "default") != "default" else list(PRESETS)
    each = [preset_settings(name, **given) for name in names]
    if any(s != each[0] for s in each):  # left to the default of its day: the name is all that is known
        return dict(options)
    return {**{k: v for k, v in options.items() if k != "preset"}, **each[0]}


def changed_settings(setting: str, record: dict) -> dict:
    """What a run set differently from Table 1's learned column of `setting` (its data's match batch size
    included, which a `-b<N>` run changes), setting by setting (`effective`)."""
    table1 = tomllib.loads((GRIDS / f"table1_{setting}.toml").read_text())
    base = {k: v for k, v in effective(table1["methods"]["learned"]).items() if k not in RUN_OPTIONS}
    options = {k: v for k, v in effective(record["options"]).items() if k not in RUN_OPTIONS}
    changed = {k: v for k, v in options.items() if base.get(k) != v}
    changed.update({k: None for k in base if k not in options})  # an option the run left at its default
    batch = next((part[1:] for part in record["method"].split("-") if part[:1] == "b" and part[1:].isdigit()), None)
    if batch:
        changed["match_batch_size"] = int(batch)
    return changed


def summarise(folder: Path, setting: str | None = None) -> dict:
    units = read_grid(folder)
    rows = {}
    for method, by_pair in units.items():
        pairs = sorted(by_pair)
        recs = [by_pair[p] for p in pairs]
        if recs[0]["info"].get("method") != "learned":
            continue
        rows[method] = {"pairs": [list(p) for p in pairs], "steps": recs[0]["options"]["steps"],
                        "changed": changed_settings(setting, recs[0]) if setting else {},
                        "barrier": _stats([r["barrier"] for r in recs]),
                        "barrier_per_pair": [r["barrier"] for r in recs],
                        "seconds": _stats([solve_seconds(r) for r in recs]),
                        "steps_taken": _stats([r["info"]["steps"] for r in recs]),
                        "val_history": [r["info"]["val_history"] for r in recs],
                        "models": [[r["info"].get("fingerprint_a"), r["info"].get("fingerprint_b")] for r in recs],
                        "grid": str(folder)}
    return rows


def models_tag(row: dict) -> str:
    """A short name for the models a run aligned (the fingerprints of its first pair's two models): rows with
    equal tags ran on the same models (a grid that retrains them on another CPU may get other ones)."""
    models = row.get("models")
    first = models[min(range(len(row["pairs"])), key=lambda i: row["pairs"][i])] if models else None
    return hashlib.sha1(repr(first).encode()).hexdigest()[:6]


def merge_rows(rows: dict, new: dict, folder: Path) -> None:
    """Add a grid's rows to a setting's; a method name another grid already gave is kept apart by its folder."""
    for method, row in new.items():
        rows[method if method not in rows else f"{method} @{folder.name}"] = row


def lower_than_table1(rows: dict, row: dict) -> str:
    """On how many of its pairs a run's barrier is below that of the run with Table 1's settings and the
    same steps on the same models ("" where there is no such run, or this is it)."""
    ref = next((r for r in rows.values() if not r.get("changed") and r["steps"] == row["steps"]
                and models_tag(r) == models_tag(row)), None)
    if ref is None or ref is row:
        return ""

    def by_pair(r):  # a pair counts as shared only where both runs aligned the same two models
        models = r.get("models") or [None] * len(r["pairs"])
        return {(tuple(p), tuple(m) if m else None): b for p, m, b in zip(r["pairs"], models, r["barrier_per_pair"])}
    theirs = by_pair(ref)
    shared = [(b, theirs[key]) for key, b in by_pair(row).items() if key in theirs]
    return f"{sum(b < t for b, t in shared)}/{len(shared)}" if shared else ""


def markdown(results: dict) -> str:
    out = [f"Learned matching per budget: test loss barrier and seconds of one core per pair, median [min, max] "
           f"(goal: median <= {GOAL} within {BUDGET_SECONDS:.0f} s):", "",
           "| setting | run | changed from Table 1 | models | pairs | steps taken | seconds | barrier | lower than "
           "Table 1's settings | goal met |",
           "|---|---|---|---|---:|---:|---:|---:|---:|---|"]
    for setting, rows in results.items():
        for method, r in sorted(rows.items(), key=lambda kv: kv[1]["seconds"]["median"]):
            met = r["barrier"]["median"] <= GOAL
            within = r["seconds"]["median"] <= BUDGET_SECONDS
            changed = ", ".join(f"{k} {v}" for k, v in r.get("changed", {}).items()) or "-"
            out.append(f"| {SETTINGS.get(setting, setting)} | {method} | {changed} | {models_tag(r)} | {len(r['pairs'])} | "
                       f"{_fmt(r['steps_taken'], 0)} | {_fmt(r['seconds'], 0)} | {_fmt(r['barrier'])} | "
                       f"{lower_than_table1(rows, r)} | "
                       f"{'yes' if met and within else ('barrier only' if met else 'no')} |")
    out += ["", "models: a tag of the aligned models' fingerprints; barriers compare pair by pair only between rows "
            "with equal tags, and seconds only between runs on the same CPU (the grids' machine.json)."]
    return "\n".join(out) + "\n"


def plot(results: dict, path: Path) -> None:
    """One panel per setting, one line per set of changed settings through its budgets; the barrier axis is
    linear below 1e-3 (symlog) so that pairs at zero show."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(4.6 * len(results), 5.2), squeeze=False)
    for ax, (setting, rows) in zip(axes[0], results.items()):
        curves: dict = {}  # one line per set of changed settings and models: its budgets
        for r in rows.values():
            changed = ", ".join(f"{k} {v}" for k, v in r.get("changed", {}).items()) or "Table 1's settings"
            curves.setdefault(f"{changed} (models {models_tag(r)})", []).append(
                (r["seconds"]["median"], r["barrier"]["median"], r["barrier"]["min"], r["barrier"]["max"]))
        colours = plt.get_cmap("tab20")
        for i, (changed, pts) in enumerate(sorted(curves.items())):
            xs, ys, lo, hi = zip(*sorted(pts))
            line, = ax.plot(xs, ys, "o-", color=colours(i % 20), label=textwrap.fill(changed, 70))
            ax.vlines(xs, lo, hi, color=line.get_color(), alpha=0.35)
        ax.axhline(GOAL, color="k", ls="--", lw=0.8)
        ax.axvline(BUDGET_SECONDS, color="k", ls=":", lw=0.8)
        ax.set_xscale("log")
        ax.set_yscale("symlog", linthresh=1e-3)
        ax.set_ylim(bottom=0)  # a barrier is never below zero (the path's ends are on the chord)
        ax.set(title=SETTINGS.get(setting, setting), xlabel="seconds of learned matching per pair (one core)",
               ylabel="test loss barrier (median, range)")
        ax.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=1, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sp = sub.add_parser("spec", help="write the derived grid spec")
    sp.add_argument("setting", choices=sorted(SETTINGS))
    sp.add_argument("--steps", type=int, nargs="+", required=True)
    sp.add_argument("--match-batch-size", type=int)
    sp.add_argument("--lr", type=float)
    sp.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a learned-matching option for every budget (repeatable), e.g. temperature=2")
    sp.add_argument("--out", required=True)
    tp = sub.add_parser("table", help="summarise finished grids")
    tp.add_argument("grids", nargs="+", metavar="SETTING=FOLDER", help="a setting may be named more than once")
    tp.add_argument("--out", default=str(RESULTS / "learned_budget"))
    args = p.parse_args()
    if args.cmd == "spec":
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        spec = derived_spec(args.setting, args.steps, args.match_batch_size, args.lr, parse_sets(args.set))
        Path(args.out).write_text(f"# derived from bench/grids/table1_{args.setting}.toml by bench/learned_budget.py\n"
                                  + to_toml(spec))
        print(f"-> {args.out}")
        return
    results: dict = {}
    for g in args.grids:
        setting, _, folder = g.partition("=")
        merge_rows(results.setdefault(setting, {}), summarise(Path(folder), setting), Path(folder))
    record = {"kind": "learned_budget", "machine": cpu_model(), "cpu_capability": cpu_capability(),
              "grids": args.grids, "load_average": os.getloadavg(), "goal": GOAL,
              "budget_seconds": BUDGET_SECONDS, "settings": results}
    out = write_study(args.out, record, markdown(results))
    plot(results, out.with_suffix(".png"))
    print(f"-> {out}.json, {out}.md, {out}.png")


if __name__ == "__main__":
    main()
