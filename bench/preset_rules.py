"""Which learned-matching preset `preset="default"` should pick, pair by pair: "distill", "paper" or "labels".

For every Table 1 setting, the per-pair barriers of each preset at 300 steps, which is lowest, and the regret of
each candidate default (always one preset; the library's rule `default_preset`, applied to each pair's end-model
training loss as its learned units recorded it): the chosen preset's barrier minus the lowest one's (absolute) and
over it (relative). "labels" is the distill settings with the task-loss target. A setting's presets come from
committed grids (SOURCES) that hold the same models, checked by their fingerprints. The equal-seconds section
compares distill at more steps against paper on the GPT-2s.

    python bench/preset_rules.py --out bench/results/preset_rules
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from learned_subsets import RESULTS, SETTINGS, _fmt, _stats, read_grid, solve_seconds  # noqa: E402
from common import write_study  # noqa: E402

from lmc_fast.match.learned import MEMORISED_LOSS, default_preset  # noqa: E402

#: each preset and the grid columns that ran it at 300 steps (Table 1's name, then the studies')
PRESETS = {"distill": ("learned", "learned-300"), "paper": ("learned-paper", "learned-paper-300"),
           "labels": ("learned-labels", "learned-300-targetlabels")}
#: per setting, the folders under bench/results whose columns are compared: they must hold the same models. The
#: GPT-2s' and BERTs' Table 1 rows hold other models than the studies that ran all three presets, so they come
#: from those.
SOURCES = {"digits": ("table1/digits", "learned_settings/digits_labels"),
           "fashion": ("table1/fashion", "learned_settings/fashion_labels"),
           "shakespeare": ("learned_settings/shakespeare_equal_seconds", "learned_settings/shakespeare_presets_parts"),
           "llama": ("table1/llama", "learned_settings/llama_labels"),
           "neox": ("table1/neox", "learned_settings/neox_labels"),
           "bert": ("learned_settings/bert_presets",)}
#: the settings' names in the tables: Table 1's five learned-study rows and the tiny BERTs (masked-token loss; all
#: three presets in one grid: the BERTs retrained for it are not bit for bit Table 1's)
SETTING_NAMES = {**SETTINGS, "bert": "tiny BERT (masked tokens), Shakespeare"}
EQUAL_SECONDS = "learned_settings/shakespeare_equal_seconds"
CANDIDATES = ("always distill", "always paper", "always labels", "library rule")


def choice(candidate: str, row: dict) -> str:
    """The preset a candidate default picks for one pair (the library's rule: from its end models' training loss)."""
    if candidate.startswith("always "):
        return candidate.removeprefix("always ")
    return default_preset(row["training loss"])


def fingerprints(folder: Path):
    grid = folder / "grid.json"
    return json.loads(grid.read_text()).get("fingerprints") if grid.is_file() else None


def setting_rows(root: Path, setting: str) -> list[dict]:
    """Per pair, each preset's barrier and solve seconds from the setting's sources (the first column found)."""
    folders = [root / s for s in SOURCES[setting] if (root / s / "results.jsonl").is_file()]
    if not folders:
        return []
    prints = [fingerprints(f) for f in folders]
    for f, fp in zip(folders[1:], prints[1:]):
        if fp is not None and prints[0] is not None and fp != prints[0]:
            raise SystemExit(f"{f}: holds other models than {folders[0]} (their fingerprints differ)")
    found: dict = {}
    for folder in folders:
        units = read_grid(folder)
        for preset, columns in PRESETS.items():
            for column in columns:
                for pair, record in units.get(column, {}).items():
                    found.setdefault(pair, {}).setdefault(preset, record)
    rows = []
    for pair in sorted(found):
        if set(found[pair]) != set(PRESETS):
            continue
        # the rule's input, as the grid's learned units measured it (end models' loss on the matching batches)
        losses = [r.get("info", {}).get("end_models_training_loss") for r in found[pair].values()]
        losses = [x for x in losses if x is not None]
        if not losses:
            raise SystemExit(f"{setting}: pair {pair} has no end_models_training_loss in its learned records")
        rows.append({"pair": list(pair), "training loss": max(losses),
                     **{p: found[pair][p]["barrier"] for p in found[pair]},
                     **{f"{p} s": solve_seconds(found[pair][p]) for p in found[pair]}})
    return rows


def regrets(rows: list[dict], candidate: str) -> list[tuple[float, float]]:
    out = []
    for r in rows:
        best, chosen = min(r[p] for p in PRESETS), r[choice(candidate, r)]
        out.append((chosen - best, (chosen - best) / best if best > 0 else 0.0))
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--results", type=Path, default=RESULTS, help="the folder SOURCES are under (bench/results)")
    p.add_argument("--out", type=Path, default=RESULTS / "preset_rules")
    args = p.parse_args()

    settings = {key: rows for key in SETTING_NAMES if (rows := setting_rows(args.results, key))}
    if not settings:
        raise SystemExit(f"{args.results}: no setting has a pair with all of {', '.join(PRESETS)}")

    lines = ["Learned matching's presets per Table 1 pair (300 steps each): barrier of `distill` (end-model targets, "
             "lambda ~ U[0, 1], lr 1e-2), `paper` (task loss, lambda ~ U[0.4, 0.6], 4 a step, lr 3e-3) and `labels` "
             "(distill's settings with the task loss), median [min, max], on how many pairs each is the lowest, "
             "and the end models' training loss (median) that the library's rule reads.",
             "", "| setting | pairs | " + " | ".join(PRESETS) + " | " + " | ".join(f"{p} lowest" for p in PRESETS)
             + " | training loss | library rule picks |", "|---|---:|" + "---:|" * (2 * len(PRESETS) + 1) + "---|"]
    for key, rows in settings.items():
        lowest = {p: sum(r[p] == min(r[q] for q in PRESETS) for r in rows) for p in PRESETS}
        lines.append(f"| {SETTING_NAMES[key]} | {len(rows)} | "
                     + " | ".join(_fmt(_stats([r[p] for r in rows]), 4) for p in PRESETS) + " | "
                     + " | ".join(f"{lowest[p]}/{len(rows)}" for p in PRESETS)
                     + f" | {statistics.median(r['training loss'] for r in rows):.2g} | "
                     + ", ".join(sorted({choice('library rule', r) for r in rows})) + " |")
    lines += ["", "Sources (same models within a setting): " + "; ".join(
                  f"{key}: {', '.join(SOURCES[key])}" for key in settings) + ".", "",
              f"Regret of each default over all {sum(map(len, settings.values()))} pairs: the chosen preset's "
              "barrier minus the lowest of the three (absolute), and over it (relative); worst pair and mean.", "",
              "| default | worst absolute | mean absolute | worst relative | mean relative | pairs it loses |",
              "|---|---:|---:|---:|---:|---:|"]
    summary = {}
    for cand in CANDIDATES:
        rs = [x for rows in settings.values() for x in regrets(rows, cand)]
        absolute, relative = [a for a, _ in rs], [r for _, r in rs]
        summary[cand] = {"worst_absolute": max(absolute), "mean_absolute": statistics.mean(absolute),
                         "worst_relative": max(relative), "mean_relative": statistics.mean(relative),
                         "pairs_lost": sum(a > 0 for a in absolute), "pairs": len(rs)}
        s = summary[cand]
        lines.append(f"| {cand} | {s['worst_absolute']:.4f} | {s['mean_absolute']:.4f} | {s['worst_relative']:.0%} | "
                     f"{s['mean_relative']:.0%} | {s['pairs_lost']}/{s['pairs']} |")

    record = {"memorised_loss": MEMORISED_LOSS, "presets": PRESETS,
              "sources": {key: SOURCES[key] for key in settings}, "settings": settings, "candidates": summary}
    equal_seconds = args.results / EQUAL_SECONDS
    if (equal_seconds / "results.jsonl").is_file():
        units = read_grid(equal_seconds)
        distills = sorted((m for m in units if m.startswith("learned-") and not m.startswith("learned-paper")),
                          key=lambda m: int(m.split("-")[1]))
        papers = [m for m in units if m.startswith("learned-paper")]
        if not distills or len(papers) != 1:
            raise SystemExit(f"{equal_seconds}: wants learned-N columns and one learned-paper-M column")
        lines += ["", f"At equal seconds ({equal_seconds.name}): `distill` at more steps against `paper`, per pair "
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
        record["equal_seconds"] = {"grid": equal_seconds.name, "rows": rows, "medians": med,
                                   "median_seconds": secs, "distill_lower": lower}
    write_study(args.out, record, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
