"""What learned matching changes: learned matching restricted to each subset of groups on the Table 1 pairs.

The paper's authors wrote that the only difference between the weight-matching and the learned-matching
solutions is the residual stream's orthogonal map. Two tests of that, on the 5 pairs of each Table 1
setting, every learned run with Table 1's "learned" settings (300 steps, same data, same start):
- how far the unrestricted run moved from its start, per family of groups (`info["moved"]`:
  permutations as the fraction of units reassigned, maps as the relative Frobenius change);
- learned matching restricted to the residual alone, the heads alone, the MLP units alone, and all
  but the residual, each against the unrestricted run's barrier.

    python bench/learned_subsets.py spec digits --out /tmp/ls/digits.toml
    torchrun --standalone --nproc_per_node 2 -m lmc_fast.cli grid /tmp/ls/digits.toml --out /tmp/lmc_grids/ls_digits
    python bench/learned_subsets.py table digits=/tmp/lmc_grids/ls_digits llama=/tmp/lmc_grids/ls_llama ...

`spec` derives the grid from bench/grids/table1_<setting>.toml (its data, models and learned settings,
unchanged; the methods replaced; no simplex). `table` writes bench/results/learned_subsets.{json,md}.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tomllib
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import cpu_model, write_study  # noqa: E402

def cpu_capability() -> str:
    """The kernels torch's CPU ops run here ("AVX2", "AVX512", ...)."""
    return torch.backends.cpu.get_cpu_capability()


GRIDS = Path(__file__).resolve().parent / "grids"
RESULTS = Path(__file__).resolve().parent / "results"
SETTINGS = {"digits": "ViT, digits", "fashion": "ViT, Fashion-MNIST", "shakespeare": "GPT-2, Shakespeare",
            "llama": "tiny LLaMA, Shakespeare", "neox": "tiny GPT-NeoX, Shakespeare", "bert": "tiny BERT, Shakespeare"}
#: grid method name -> the `learn` mode it trains (lmc_fast.match.options.LEARN_MODES)
SUBSETS = {"learned": "all", "learned-residual": "residual", "learned-heads": "heads", "learned-mlp": "mlp",
           "learned-no-residual": "no_residual"}
#: both models' elements learn (LMC-DM), every group, the same steps: compared with "learned"
BOTH = "learned-both"
#: one side at twice the learning rate: two latents composed move the alignment about twice as far per
#: Adam step, so this is the control for "both sides learn better"
DOUBLE_LR = "learned-lr2x"
REFERENCES = ["none", "weight"]
METHODS = REFERENCES + list(SUBSETS) + [BOTH, DOUBLE_LR]


def derived_spec(setting: str) -> dict:
    """Table 1's spec for `setting` with the subset methods in place of its methods."""
    spec = tomllib.loads((GRIDS / f"table1_{setting}.toml").read_text())
    learned = dict(spec["methods"]["learned"])
    learned.pop("method", None)
    spec["grid"]["methods"] = list(METHODS)
    spec["methods"] = {name: {**({"method": "learned"} if name != "learned" else {}), **learned, "learn": mode}
                       for name, mode in SUBSETS.items()}
    spec["methods"][BOTH] = {"method": "learned", **learned, "learn": "all", "sides": "both"}
    spec["methods"][DOUBLE_LR] = {"method": "learned", **learned, "learn": "all", "lr": 2 * learned["lr"]}
    spec.pop("simplex", None)
    return spec


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"no TOML form for {type(v).__name__}")


def to_toml(spec: dict) -> str:
    """Tables of scalars and lists (what a grid spec holds), one [section] or [section.sub] each."""
    lines = []

    def table(prefix: str, obj: dict):
        scalars = {k: v for k, v in obj.items() if not isinstance(v, dict)}
        if scalars:
            lines.append(f"[{prefix}]")
            lines.extend(f"{json.dumps(k) if '-' in k else k} = {_toml_value(v)}" for k, v in scalars.items())
            lines.append("")
        for k, v in obj.items():
            if isinstance(v, dict):
                table(f"{prefix}.{json.dumps(k) if '-' in k else k}" if prefix else k, v)

    table("", spec)
    return "\n".join(lines)


def _stats(values: list) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "values": values}


def _fmt(s: dict | None, digits: int = 3) -> str:
    return "" if s is None else f"{s['median']:.{digits}f} [{s['min']:.{digits}f}, {s['max']:.{digits}f}]"


def read_grid(folder: Path) -> dict:
    """{method: {pair: unit record}} from a grid's unit records (pair units only): its units/ folder while
    it runs or after a kill, else its results.jsonl (what bench/results keeps)."""
    out: dict = {}
    units = sorted((folder / "units").glob("*.json")) if (folder / "units").is_dir() else []
    records = ([json.loads(u.read_text()) for u in units] if units
               else [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines()])
    for r in records:
        if r.get("pair") is not None:
            out.setdefault(r["method"], {})[tuple(r["pair"])] = r
    return out


def solve_seconds(record: dict) -> float:
    """The alignment's own solve time: a learned run's loop (kept in its alignment, so a unit that found
    its alignment finished after a restart, and reports 0 s of solve, still has it), else the unit's."""
    return record["info"].get("seconds", record["seconds"]["solve"])


def summarise(setting: str, folder: Path) -> dict:
    units = read_grid(folder)
    required = REFERENCES + ["learned"]  # the other runs are reported where every pair has them
    pairs = sorted(set.intersection(*(set(units.get(m, {})) for m in required)))
    if not pairs:
        raise SystemExit(f"{folder}: no pair has {', '.join(required)} yet")
    present = required + [m for m in [*SUBSETS, BOTH, DOUBLE_LR]
                          if m not in required and all(p in units.get(m, {}) for p in pairs)]
    row = {"pairs": [list(p) for p in pairs], "barrier": {}, "seconds": {}, "moved": {}, "below_all": {}}
    for m in present:
        row["barrier"][m] = _stats([units[m][p]["barrier"] for p in pairs])
        row["seconds"][m] = _stats([solve_seconds(units[m][p]) for p in pairs])
    full = [units["learned"][p]["barrier"] for p in pairs]
    for m in present[len(REFERENCES):]:  # on how many pairs a run gets within 10% of the unrestricted one-sided run
        row["below_all"][m] = sum(units[m][p]["barrier"] <= 1.1 * f for p, f in zip(pairs, full))
    # the way the unrestricted run travelled, per family and element key, over the pairs
    moved: dict = {}
    for p in pairs:
        for family, keys in units["learned"][p]["info"]["moved"].items():
            for key, v in keys.items():
                moved.setdefault(family, {}).setdefault(key, []).append(v)
    row["moved"] = {f: {k: _stats(v) for k, v in keys.items()} for f, keys in moved.items()}
    row["start"] = sorted({units["learned"][p]["info"].get("init") for p in pairs})
    return row


#: "the learned solution differs from weight matching's only in the residual map": every other element
#: moved by less than this (fraction of units reassigned, relative Frobenius change of a map)
STILL = 0.05
#: "better residual alignment is the key": learning the residual alone closes at least this share of
#: the weight-to-learned gap (medians)
KEY_SHARE = 0.8


def verdict(row: dict) -> str:
    """Two sentences, one per claim of the paper's authors, each 'held' or 'not held' by the numbers."""
    b = {m: row["barrier"][m]["median"] for m in row["barrier"]}
    gap = b["weight"] - b["learned"]
    closed = {m: (b["weight"] - b[m]) / gap if gap > 0 else float("nan") for m in SUBSETS if m in b}
    others = {f"{family} {key}": st["median"] for family, keys in row["moved"].items() if family != "residual"
              for key, st in keys.items()}
    biggest = max(others, key=others.get)
    only = all(v < STILL for v in others.values())
    first = (f"only the residual moves: {'held' if only else 'not held'} (the residual's map changes by "
             f"{row['moved']['residual']['matrix']['median']:.2f}; the largest other change is {biggest}, "
             f"{others[biggest]:.3f})")
    if "learned-residual" not in closed:
        return first + ". The residual is the key: not measured on every pair"
    key = closed["learned-residual"] >= KEY_SHARE
    rest = ", ".join(f"{label} {closed[m]:.0%}" for m, label in (
        ("learned-no-residual", "all but the residual"), ("learned-heads", "heads alone"), ("learned-mlp", "MLP alone"))
        if m in closed)
    return (first + f". The residual is the key: {'held' if key else 'not held'} (learning it alone closes "
            f"{closed['learned-residual']:.0%} of the weight-to-learned gap, barrier {b['learned-residual']:.3f} "
            f"against {b['learned']:.3f}" + (f"; {rest})" if rest else ")"))


def markdown(rows: dict) -> str:
    names = METHODS
    out = ["Learned matching restricted to groups, 300 steps each (Table 1's learned settings), loss barrier "
           "median [min, max] over the pairs:", "",
           "| setting | pairs | " + " | ".join(names) + " |", "|---|---:|" + "---:|" * len(names)]
    for s, row in rows.items():
        out.append(f"| {SETTINGS.get(s, s)} | {len(row['pairs'])} | "
                   + " | ".join(_fmt(row["barrier"].get(m)) for m in names) + " |")
    out += ["", "How far the unrestricted run moved from its start (median [min, max] over the pairs; permutations: "
            "fraction of units reassigned, maps: relative Frobenius change), per family and element:", "",
            "| setting | family | element | moved |", "|---|---|---|---:|"]
    for s, row in rows.items():
        for family, keys in row["moved"].items():
            for key, st in keys.items():
                out.append(f"| {SETTINGS.get(s, s)} | {family} | {key} | {_fmt(st)} |")
    out += ["", "Seconds of learned matching (solve), median per pair: "
            + "; ".join(f"{SETTINGS.get(s, s)} " + ", ".join(f"{m} {row['seconds'][m]['median']:.0f}"
                                                            for m in row["seconds"] if m not in REFERENCES)
                        for s, row in rows.items()), ""]
    out += ["The authors' two claims, per setting (medians; 'held' where every other element moved by less than "
            f"{STILL} / where the residual alone closes at least {KEY_SHARE:.0%} of the gap):", ""]
    out += [f"- {SETTINGS.get(s, s)}: {verdict(row)}." for s, row in rows.items()]
    return "\n".join(out) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sp = sub.add_parser("spec", help="write the derived grid spec")
    sp.add_argument("setting", choices=sorted(SETTINGS))
    sp.add_argument("--out", required=True)
    tp = sub.add_parser("table", help="summarise finished grids")
    tp.add_argument("grids", nargs="+", metavar="SETTING=FOLDER")
    tp.add_argument("--out", default=str(RESULTS / "learned_subsets"))
    args = p.parse_args()
    if args.cmd == "spec":
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(f"# derived from bench/grids/table1_{args.setting}.toml by bench/learned_subsets.py\n"
                                  + to_toml(derived_spec(args.setting)))
        print(f"-> {args.out}")
        return
    rows = {}
    for g in args.grids:
        setting, _, folder = g.partition("=")
        rows[setting] = summarise(setting, Path(folder))
    # the grids ran here: models trained on another instruction set differ (training is not bit-identical)
    result = {"kind": "learned_subsets", "machine": cpu_model(), "cpu_capability": cpu_capability(),
              "grids": {s: f.partition("=")[2] for s, f in zip(rows, args.grids)},
              "load_average": os.getloadavg(), "subsets": SUBSETS, "settings": rows}
    out = write_study(args.out, result, markdown(rows))
    print(f"-> {out}.json, {out}.md")


if __name__ == "__main__":
    main()
