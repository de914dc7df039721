"""The paper's Table 1 as distributions: one table from the grids of bench/grids/table1_*.toml.

    lmc-fast grid bench/grids/table1_digits.toml --out /tmp/lmc_grids/table1_digits   # and the others
    python bench/table1_summary.py --grids /tmp/lmc_grids

Reads each grid's results.jsonl and grid.json (what `lmc-fast grid` wrote) from --grids, or, for a setting
whose grid is not there, the copies committed in bench/results/table1/<name>/ (table1_llama -> llama), so one
new grid updates its row without rerunning the others; a column a grid did not compute but another committed
grid did with the same settings (BORROWED: equal unit keys) is read from there; writes bench/results/table1.json
(per setting and method: the loss barrier's median, min, max over the pairs, the accuracy and, for
language models, the perplexity at lambda = 0.5; the simplex centroid's excess loss) and
bench/results/table1.md (the markdown tables the README quotes).
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

SETTINGS = {  # grid folder name -> (row label, language model?)
    "table1_digits": ("ViT, digits", False),
    "table1_fashion": ("ViT, Fashion-MNIST", False),
    "table1_shakespeare": ("GPT-2, Shakespeare", True),
    "table1_llama": ("tiny LLaMA, Shakespeare", True),
    "table1_neox": ("tiny GPT-NeoX, Shakespeare", True),
    "table1_bert": ("tiny BERT (masked tokens), Shakespeare", True),
    "table1_mamba": ("tiny Mamba, Shakespeare", True),
}
RESULTS = Path(__file__).parent / "results"
GRIDS = Path(__file__).parent / "grids"
COMMITTED = RESULTS / "table1"  # each grid's summary files, as committed
#: in this order; a column shows where any setting's grid ran the method (issue 22's: "residual-act", the residual's
#: rotation from one batch of activations with weight matching for the rest; "learned-both", latents on both models)
COLUMNS = ("none", "permutation", "activation", "residual-act", "weight", "learned-perm", "learned", "learned-both",
           "learned-paper", "learned-loop")
#: Columns that Table 1's specs name but whose units were computed by another committed grid (folder under
#: bench/results, its column): taken only where that column's settings give the same unit key as Table 1's,
#: and marked where that grid's models are not the Table 1 grid's (same recipe and seeds, trained elsewhere).
#: A re-run of a Table 1 spec computes the column itself, and its own records are read instead.
BORROWED = {"learned-loop": {
    "table1_digits": ("learned_settings/digits_labels_loop", "learned-distill-loop"),
    "table1_fashion": ("learned_settings/fashion_labels_loop", "learned-labels-loop"),
    "table1_shakespeare": ("learned_settings/shakespeare_labels_loop", "learned-labels-loop"),
    "table1_llama": ("learned_settings/llama_labels_loop", "learned-labels-loop"),
    "table1_neox": ("learned_settings/neox_labels_loop", "learned-labels-loop"),
    "table1_bert": ("learned_settings/bert_labels_loop", "learned-labels-loop"),
}}


def _stats(values):
    values = [v for v in values if v is not None and math.isfinite(v)]
    if not values:
        return None
    return {"n": len(values), "median": statistics.median(values), "min": min(values), "max": max(values)}


def read_grid(folder: Path) -> tuple[list, dict]:
    """A grid's records (results.jsonl) and its grid.json."""
    records = [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines() if line.strip()]
    return records, json.loads((folder / "grid.json").read_text())


def summarise(folder: Path, language: bool) -> dict:
    records, grid = read_grid(folder)
    pairs = [r for r in records if r.get("kind", "pair") == "pair"]
    simplex = [r for r in records if r.get("kind") == "simplex"]
    out = {"models": len(grid["models"]), "pairs": grid["pairs"], "lambdas": len(grid["lambdas"]),
           "data": grid["data"], "methods": {}, "simplex": {}}
    if (folder / "machine.json").exists():  # where and how long the grid ran (written beside it when recorded)
        out["machine"] = json.loads((folder / "machine.json").read_text())
    if (folder / "partial" / "results.jsonl").exists():
        # columns finished on fewer pairs than the grid's, run as their own grid: kept apart, never in the tables
        out["partial"] = summarise(folder / "partial", language)
    ends = [r["curve"] for r in pairs if r["method"] == pairs[0]["method"]]  # each pair once: its end models
    out["end_models_acc"] = _stats([c["acc"][i] for c in ends for i in (0, -1)])
    if language:
        out["end_models_ppl"] = _stats([math.exp(c["loss"][i]) for c in ends for i in (0, -1)])
    for m in grid["methods"]:
        out["methods"][m] = method_row([r for r in pairs if r["method"] == m], language)
    for m in grid.get("simplex_methods", []):
        rs = [r for r in simplex if r["method"] == m]
        out["simplex"][m] = {"centroid_excess": _stats([r["centroid"] for r in rs]),
                             "centroid_acc": _stats([r["centroid_acc"] for r in rs]),
                             "groups": [r["models"] for r in rs]}
    return out


def method_row(records: list, language: bool) -> dict:
    row = {"barrier": _stats([r["barrier"] for r in records]), "acc_mid": _stats([r["acc_mid"] for r in records]),
           "solve_seconds": _stats([r["seconds"]["solve"] for r in records]),
           "options": records[0]["options"] if records else {}}
    if language:
        row["ppl_mid"] = _stats([math.exp(r["loss_mid"]) for r in records])
    return row


def borrow(name: str, folder: Path, table: dict, language: bool) -> None:
    """Add to `table` (the summary of setting `name`'s grid in `folder`) the BORROWED columns it did not compute."""
    from lmc_fast.grid.spec import load_spec
    from lmc_fast.grid.units import unit_key

    for column, sources in BORROWED.items():
        if name not in sources or column in table["methods"]:
            continue
        source, method = sources[name]
        ours, theirs = load_spec(GRIDS / f"{name}.toml"), load_spec(RESULTS / source / "spec.toml")
        # equal keys on any one pair of models: the same computation (method, options, the settings a preset
        # leaves, matching data, sweep) wherever the models are equal
        if unit_key(ours, "a", "b", column) != unit_key(theirs, "a", "b", method):
            raise SystemExit(f"{source}: its {method} is not Table 1's {column} of {name} (settings or data differ)")
        records, grid = read_grid(RESULTS / source)
        mine = json.loads((folder / "grid.json").read_text())
        if [list(p) for p in grid["pairs"]] != [list(p) for p in mine["pairs"]]:
            raise SystemExit(f"{source}: pairs {grid['pairs']} are not Table 1's {mine['pairs']}")
        used = sorted({k for p in mine["pairs"] for k in p})
        row = method_row([r for r in records if r["method"] == method and r.get("kind", "pair") == "pair"], language)
        row.update(source=f"bench/results/{source} ({method})",
                   same_models=all(grid["fingerprints"][k] == mine["fingerprints"][k] for k in used))
        table["methods"][column] = row


def _cell(s, digits=3, pct=False):
    if s is None:
        return ""
    f = (lambda v: f"{100 * v:.1f}%") if pct else (lambda v: f"{v:.{digits}f}")
    return f"{f(s['median'])} [{f(s['min'])}, {f(s['max'])}]"


def _mark(setting: dict, column: str) -> str:
    return " †" if setting["methods"].get(column, {}).get("same_models") is False else ""


def _borrowed_notes(table: dict) -> list[str]:
    """Where each borrowed column's cells come from (a column a Table 1 grid computed itself needs no note)."""
    lines = []
    for column in BORROWED:
        rows = {name: t["methods"][column] for name, t in table.items() if "source" in t["methods"].get(column, {})}
        if not rows:
            continue
        lines += ["", f"{column}: computed for another study with the settings of Table 1's spec (equal unit keys), "
                      "read from " + "; ".join(f"{SETTINGS[n][0]}: {r['source']}" for n, r in rows.items()) + "."]
        other = [SETTINGS[n][0] for n, r in rows.items() if not r["same_models"]]
        if other:
            lines.append(f"† On other models than the row's ({', '.join(other)}): the same recipe and seeds, "
                         "trained on another machine (training is not bit-identical across machines).")
    return lines


def markdown(table: dict) -> str:
    cols = [c for c in COLUMNS if any(c in t["methods"] for t in table.values())]
    lines = ["Loss barrier, median [min, max] over independent pairs:", "",
             "| setting | pairs | " + " | ".join(cols) + " |", "|---|---:|" + "---:|" * len(cols)]
    for name, t in table.items():
        label = SETTINGS[name][0]
        cells = [_cell(t["methods"].get(c, {}).get("barrier")) + _mark(t, c) for c in cols]
        lines.append(f"| {label} | {len(t['pairs'])} | " + " | ".join(cells) + " |")
    lines += _borrowed_notes(table)
    lines += ["", "At lambda = 0.5: accuracy (images) or perplexity (text), median [min, max]; \"models\": the "
              "end models themselves:", "",
              "| setting | models | " + " | ".join(cols) + " |", "|---|---:|" + "---:|" * len(cols)]
    for name, t in table.items():
        label, language = SETTINGS[name]
        key = "ppl_mid" if language else "acc_mid"
        ends = _cell(t["end_models_ppl" if language else "end_models_acc"], 2, pct=not language)
        cells = [_cell(t["methods"].get(c, {}).get(key), 2, pct=not language) + _mark(t, c) for c in cols]
        lines.append(f"| {label} | {ends} | " + " | ".join(cells) + " |")
    simplex_cols = [c for c in COLUMNS if any(c in t["simplex"] for t in table.values())]
    lines += ["", "Three-model centroid (the others aligned to the first): loss above the models' mean, "
              "median [min, max] over 3 groups:", "",
              "| setting | " + " | ".join(simplex_cols) + " |", "|---|" + "---:|" * len(simplex_cols)]
    for name, t in table.items():
        if not t["simplex"]:  # a grid without simplex groups has no row here
            continue
        cells = [_cell(t["simplex"].get(c, {}).get("centroid_excess")) for c in simplex_cols]
        lines.append(f"| {SETTINGS[name][0]} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--grids", default="/tmp/lmc_grids", help="the folder holding the grids' --out folders")
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = p.parse_args()
    table = {}
    for name, (_, language) in SETTINGS.items():
        for folder in (Path(args.grids) / name, COMMITTED / name.removeprefix("table1_")):
            if (folder / "results.jsonl").exists():
                table[name] = summarise(folder, language)
                borrow(name, folder, table[name], language)
                print(f"{name}: {folder}")
                break
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "table1.json").write_text(json.dumps(table, indent=2) + "\n")
    text = markdown(table)
    (out / "table1.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
