"""Which learned-matching preset `preset="default"` should pick, pair by pair.

For every Table 1 setting, the per-pair barriers of each preset at about equal cost (300 two-lambda steps), which
is lowest, and the regret of each candidate default (always one preset; the library's rule `default_preset`,
applied to each pair's end-model training loss as its learned units recorded it): the chosen preset's barrier
minus the lowest one's (absolute) and over it (relative). "labels" is the distill settings with the task-loss
target; the "-loop" presets are the authors' training loop on them (DESCRIPTIONS). A setting's presets come from
committed grids (SOURCES) that hold the same models, checked by their fingerprints; distill, paper and labels must
be there for a pair to count, the others count where they ran. The equal-seconds section compares distill at more
steps against paper on the GPT-2s.

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
           "labels": ("learned-labels", "learned-300-targetlabels"),
           "labels-loop": ("learned-labels-loop",), "distill-loop": ("learned-distill-loop",)}
#: a pair is compared when it has these; the others count where they ran (a candidate that always picks one of them
#: is scored only if it ran on every pair)
REQUIRED = ("distill", "paper", "labels")
#: what each preset is, for the table's caption
DESCRIPTIONS = {"distill": "end-model targets, lambda ~ U[0, 1], 2 a step, lr 1e-2, 300 steps",
                "paper": "task loss, lambda ~ U[0.4, 0.6], 4 a step, lr 3e-3, 300 steps",
                "labels": "distill's settings with the task loss",
                "labels-loop": "labels with the authors' loop: one lambda a step at twice the steps (600), AdamW "
                               "weight decay 0.01, 5% warm-up, gradient clip 1",
                "distill-loop": "distill with the same loop"}
#: per setting, the folders under bench/results whose columns are compared: they must hold the same models. The
#: GPT-2s' and BERTs' Table 1 rows hold other models than the studies that ran all three presets, so they come
#: from those.
SOURCES = {"digits": ("table1/digits", "learned_settings/digits_labels", "learned_settings/digits_labels_loop"),
           "fashion": ("table1/fashion", "learned_settings/fashion_labels", "learned_settings/fashion_labels_loop"),
           "shakespeare": ("learned_settings/shakespeare_equal_seconds", "learned_settings/shakespeare_presets_parts",
                           "learned_settings/shakespeare_labels_loop"),
           "llama": ("table1/llama", "learned_settings/llama_labels", "learned_settings/llama_labels_loop"),
           "neox": ("table1/neox", "learned_settings/neox_labels", "learned_settings/neox_labels_loop"),
           "bert": ("learned_settings/bert_presets", "learned_settings/bert_labels_loop")}
#: the settings' names in the tables: Table 1's five learned-study rows and the tiny BERTs (masked-token loss; all
#: three presets in one grid: the BERTs retrained for it are not bit for bit Table 1's)
SETTING_NAMES = {**SETTINGS, "bert": "tiny BERT (masked tokens), Shakespeare"}
EQUAL_SECONDS = "learned_settings/shakespeare_equal_seconds"
CANDIDATES = tuple(f"always {p}" for p in PRESETS) + ("library rule", "former rule")
#: the library's rule until December 2026's loop presets: the same threshold, the presets without the loop
FORMER_RULE = {True: "distill", False: "labels"}


def choice(candidate: str, row: dict) -> str:
    """The preset a candidate default picks for one pair (the library's rule: from its end models' training loss)."""
    if candidate.startswith("always "):
        return candidate.removeprefix("always ")
    if candidate == "former rule":
        return FORMER_RULE[row["training loss"] < MEMORISED_LOSS]
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
        if not set(REQUIRED) <= set(found[pair]):
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


def lowest(row: dict) -> float:
    """The lowest barrier among the presets that ran on this pair."""
    return min(row[p] for p in PRESETS if p in row)


def regrets(rows: list[dict], candidate: str) -> list[tuple[float, float | None]]:
    """Per pair, (absolute, relative) regret; relative is None where the lowest barrier is 0 (no ratio)."""
    out = []
    for r in rows:
        best, chosen = lowest(r), r[choice(candidate, r)]
        out.append((chosen - best, (chosen - best) / best if best > 0 else None))
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--results", type=Path, default=RESULTS, help="the folder SOURCES are under (bench/results)")
    p.add_argument("--out", type=Path, default=RESULTS / "preset_rules")
    args = p.parse_args()

    settings = {key: rows for key in SETTING_NAMES if (rows := setting_rows(args.results, key))}
    if not settings:
        raise SystemExit(f"{args.results}: no setting has a pair with all of {', '.join(REQUIRED)}")

    lines = ["Learned matching's presets per Table 1 pair: barrier median [min, max] over the pairs where each ran, "
             "on how many of a setting's pairs each is the lowest of those that ran there, and the end models' "
             "training loss (median) that the library's rule reads. Presets: "
             + "; ".join(f"`{p}`: {DESCRIPTIONS[p]}" for p in PRESETS) + ".",
             "", "| setting | pairs | " + " | ".join(PRESETS) + " | " + " | ".join(f"{p} lowest" for p in PRESETS)
             + " | training loss | library rule picks |", "|---|---:|" + "---:|" * (2 * len(PRESETS) + 1) + "---|"]
    for key, rows in settings.items():
        ran = {p: [r for r in rows if p in r] for p in PRESETS}
        wins = {p: sum(r[p] == lowest(r) for r in ran[p]) for p in PRESETS}
        lines.append(f"| {SETTING_NAMES[key]} | {len(rows)} | "
                     + " | ".join(_fmt(_stats([r[p] for r in ran[p]]), 4) if ran[p] else "not run" for p in PRESETS)
                     + " | " + " | ".join(f"{wins[p]}/{len(rows)}" if ran[p] else "-" for p in PRESETS)
                     + f" | {statistics.median(r['training loss'] for r in rows):.2g} | "
                     + ", ".join(sorted({choice('library rule', r) for r in rows})) + " |")
    lines += ["", "Solve seconds, median over the pairs where each ran (one core a unit; the runs' loads differ, see "
              "each source's machine notes, so compare within a run or at equal load):", "",
              "| setting | " + " | ".join(PRESETS) + " |", "|---|" + "---:|" * len(PRESETS)]
    for key, rows in settings.items():
        lines.append(f"| {SETTING_NAMES[key]} | " + " | ".join(
            f"{statistics.median(r[p + ' s'] for r in rows if p in r):.0f}" if any(p in r for r in rows) else "-"
            for p in PRESETS) + " |")
    all_rows = [r for rows in settings.values() for r in rows]
    zero = sum(lowest(r) == 0 for r in all_rows)  # no relative regret on these
    scored = [c for c in CANDIDATES if all(choice(c, r) in r for r in all_rows)]
    unscored = [c for c in CANDIDATES if c not in scored]
    lines += ["", "Sources (same models within a setting): " + "; ".join(
                  f"{key}: {', '.join(SOURCES[key])}" for key in settings) + ".", "",
              f"Regret of each default over all {len(all_rows)} pairs: the chosen preset's barrier minus the lowest "
              "that ran on the pair (absolute), and over it (relative; not where the lowest is 0: "
              f"{zero} pair{'s' * (zero != 1)}); worst pair and mean. "
              "The former rule: the library's until December 2026 (distill when memorised, else labels)."
              + (f" Not scored (their preset did not run on every pair): {', '.join(unscored)}." if unscored else ""),
              "", "| default | worst absolute | mean absolute | worst relative | mean relative | pairs it loses |",
              "|---|---:|---:|---:|---:|---:|"]
    summary = {}
    for cand in scored:
        rs = [x for rows in settings.values() for x in regrets(rows, cand)]
        absolute, relative = [a for a, _ in rs], [r for _, r in rs if r is not None]
        summary[cand] = {"worst_absolute": max(absolute), "mean_absolute": statistics.mean(absolute),
                         "worst_relative": max(relative), "mean_relative": statistics.mean(relative),
                         "pairs_lost": sum(a > 0 for a in absolute), "pairs": len(rs)}
        s = summary[cand]
        lines.append(f"| {cand} | {s['worst_absolute']:.4f} | {s['mean_absolute']:.4f} | {s['worst_relative']:.0%} | "
                     f"{s['mean_relative']:.0%} | {s['pairs_lost']}/{s['pairs']} |")

    record = {"memorised_loss": MEMORISED_LOSS, "presets": PRESETS, "descriptions": DESCRIPTIONS,
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
