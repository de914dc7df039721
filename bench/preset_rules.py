"""Which learned-matching preset `preset="default"` should pick: "distill" against "paper", pair by pair.

For every Table 1 setting whose grid has both learned columns ("learned": the distill settings; "learned-paper":
the paper's), the per-pair barriers, which preset is lower, and the regret of each candidate default (always
distill, always paper, the library's rule `default_preset`): the chosen preset's barrier minus the better one's
(absolute) and over it (relative). `--equal-seconds DIR` adds a grid comparing the two at equal seconds rather than
equal steps (a paper step evaluates 4 lambdas, a distill step 2).

    python bench/preset_rules.py --equal-seconds /tmp/lmc_grids/ls_shakespeare_equal --out bench/results/preset_rules
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from learned_subsets import RESULTS, SETTINGS, _fmt, _stats, read_grid, solve_seconds  # noqa: E402
from common import write_study  # noqa: E402

from lmc_fast.match.learned import MEMORISED_LOSS, default_preset  # noqa: E402

DISTILL, PAPER = "learned", "learned-paper"
#: the end models' training loss on the matching batches, as measured for Table 1 (README, "Table 1"): the input of
#: the library's rule. Only its side of MEMORISED_LOSS matters, and every setting is far from it.
TRAINING_LOSS = {"digits": 7e-4, "fashion": 0.55, "shakespeare": 2.5, "llama": 2.1, "neox": 2.1}
CANDIDATES = ("always distill", "always paper", "library rule")


def choice(candidate: str, setting: str) -> str:
    if candidate == "always distill":
        return DISTILL
    if candidate == "always paper":
        return PAPER
    return DISTILL if default_preset(TRAINING_LOSS[setting]) == "distill" else PAPER


def compare(units: dict, a: str, b: str) -> list[dict]:
    """Per pair both runs hold: the barriers of a and b and their solve seconds."""
    pairs = sorted(set(units.get(a, {})) & set(units.get(b, {})))
    return [{"pair": list(p), a: units[a][p]["barrier"], b: units[b][p]["barrier"],
             f"{a} s": solve_seconds(units[a][p]), f"{b} s": solve_seconds(units[b][p])} for p in pairs]


def regrets(rows: list[dict], chosen: str) -> list[tuple[float, float]]:
    out = []
    for r in rows:
        best = min(r[DISTILL], r[PAPER])
        out.append((r[chosen] - best, (r[chosen] - best) / best if best > 0 else 0.0))
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--table1", type=Path, default=RESULTS / "table1", help="folder of Table 1's grid folders")
    p.add_argument("--equal-seconds", type=Path, help="a grid with learned-N (distill) and learned-paper-M columns")
    p.add_argument("--out", type=Path, default=RESULTS / "preset_rules")
    args = p.parse_args()

    settings = {}
    for key in SETTINGS:
        folder = args.table1 / key
        if (folder / "results.jsonl").is_file():
            rows = compare(read_grid(folder), DISTILL, PAPER)
            if rows:
                settings[key] = rows
    if not settings:
        raise SystemExit(f"{args.table1}: no setting has both {DISTILL} and {PAPER}")

    lines = ["Learned matching's two presets per Table 1 pair (300 steps each): barrier of `distill` (the \"learned\" "
             "column) and `paper` (\"learned-paper\"), median [min, max], and on how many pairs `distill` is lower.", "",
             "| setting | pairs | distill | paper | distill lower | library rule picks |", "|---|---:|---:|---:|---:|---|"]
    for key, rows in settings.items():
        d, pp = [r[DISTILL] for r in rows], [r[PAPER] for r in rows]
        wins = sum(r[DISTILL] < r[PAPER] for r in rows)
        lines.append(f"| {SETTINGS[key]} | {len(rows)} | {_fmt(_stats(d), 4)} | {_fmt(_stats(pp), 4)} | {wins}/{len(rows)} | "
                     f"{'distill' if choice('library rule', key) == DISTILL else 'paper'} |")
    lines += ["", f"Regret of each default over all {sum(map(len, settings.values()))} pairs: the chosen preset's "
              "barrier minus the lower of the two (absolute), and over it (relative); worst pair and mean.", "",
              "| default | worst absolute | mean absolute | worst relative | mean relative | pairs it loses |",
              "|---|---:|---:|---:|---:|---:|"]
    summary = {}
    for cand in CANDIDATES:
        rs = [x for key, rows in settings.items() for x in regrets(rows, choice(cand, key))]
        absolute, relative = [a for a, _ in rs], [r for _, r in rs]
        summary[cand] = {"worst_absolute": max(absolute), "mean_absolute": statistics.mean(absolute),
                         "worst_relative": max(relative), "mean_relative": statistics.mean(relative),
                         "pairs_lost": sum(a > 0 for a in absolute), "pairs": len(rs)}
        s = summary[cand]
        lines.append(f"| {cand} | {s['worst_absolute']:.4f} | {s['mean_absolute']:.4f} | {s['worst_relative']:.0%} | "
                     f"{s['mean_relative']:.0%} | {s['pairs_lost']}/{s['pairs']} |")

    record = {"memorised_loss": MEMORISED_LOSS, "training_loss": TRAINING_LOSS, "settings": settings,
              "candidates": summary}
    if args.equal_seconds:
        units = read_grid(args.equal_seconds)
        distills = sorted((m for m in units if m.startswith("learned-") and not m.startswith("learned-paper")),
                          key=lambda m: int(m.split("-")[1]))
        papers = [m for m in units if m.startswith("learned-paper")]
        if not distills or len(papers) != 1:
            raise SystemExit(f"{args.equal_seconds}: wants learned-N columns and one learned-paper-M column")
        lines += ["", f"At equal seconds ({args.equal_seconds.name}): `distill` at more steps against `paper`, per pair "
                  "(barrier, solve seconds):", "",
                  "| pair | " + " | ".join(distills + papers) + " |", "|---|" + "---:|" * (len(distills) + 1)]
        pairs = sorted(set.intersection(*(set(units[m]) for m in distills + papers)))
        rows = [{"pair": list(p), **{m: units[m][p]["barrier"] for m in distills + papers},
                 **{f"{m} s": solve_seconds(units[m][p]) for m in distills + papers}} for p in pairs]
        for r in rows:
            lines.append(f"| {tuple(r['pair'])} | " + " | ".join(f"{r[m]:.4f} ({r[m + ' s']:.0f} s)"
                                                                    for m in distills + papers) + " |")
        med = {m: statistics.median(r[m] for r in rows) for m in distills + papers}
        secs = {m: statistics.median(r[m + " s"] for r in rows) for m in distills + papers}
        lines.append("| median | " + " | ".join(f"{med[m]:.4f} ({secs[m]:.0f} s)" for m in distills + papers) + " |")
        lower = {m: sum(r[m] < r[papers[0]] for r in rows) for m in distills}
        lines += ["", "Pairs where `distill` is lower than `paper`: " +
                  ", ".join(f"{m} {lower[m]}/{len(rows)}" for m in distills) + "."]
        record["equal_seconds"] = {"grid": args.equal_seconds.name, "rows": rows, "medians": med,
                                   "median_seconds": secs, "distill_lower": lower}
    write_study(args.out, record, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
