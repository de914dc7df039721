"""The grid's outputs from its records: results.jsonl, summary.csv / summary.md, barriers.png, curves.png."""
from __future__ import annotations

import csv
import io
import math
import statistics
from pathlib import Path

from ..atomic import atomic_file, json_text

STATS = ("n", "median", "min", "max", "mean", "std")
#: the per-method quantities summarised: the loss barrier, the accuracy and the loss at lambda = 0.5
QUANTITIES = (("barrier", "barrier"), ("acc_mid", "acc_mid"), ("loss_mid", "loss_mid"))
#: the same for simplex groups: the centroid's loss above the models' mean loss, its accuracy, the worst sample
SIMPLEX_QUANTITIES = (("centroid", "centroid"), ("centroid_acc", "centroid_acc"), ("worst", "worst"))


def _stats(values: list[float]) -> dict:
    values = [v for v in values if v is not None and math.isfinite(v)]
    if not values:
        return {"n": 0, **{k: math.nan for k in STATS[1:]}}
    return {"n": len(values), "median": statistics.median(values), "min": min(values), "max": max(values),
            "mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else math.nan}


def pair_records(records: list[dict]) -> list[dict]:
    return [r for r in records if r.get("kind", "pair") == "pair"]


def simplex_records(records: list[dict]) -> list[dict]:
    return [r for r in records if r.get("kind") == "simplex"]


def summarise(records: list[dict], methods, quantities=QUANTITIES) -> list[dict]:
    """One row per method (in `methods` order): n and the statistics of the barrier and of acc at 0.5
    over the pair records (with `quantities=SIMPLEX_QUANTITIES`: of the centroid over simplex records)."""
    rows = []
    kind = "simplex" if quantities is SIMPLEX_QUANTITIES else "pair"
    for method in methods:
        rs = [r for r in records if r["method"] == method and r.get("kind", "pair") == kind]
        row = {"method": method, "n": len(rs)}
        for field, label in quantities:
            for k, v in _stats([r.get(field) for r in rs]).items():
                if k != "n":
                    row[f"{label}_{k}"] = v
        rows.append(row)
    return rows


def _write_text(path: Path, text: str) -> None:
    with atomic_file(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def _csv(rows: list[dict]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    for row in rows:  # NaN (a single pair's std) as an empty cell
        writer.writerow({k: ("" if isinstance(v, float) and not math.isfinite(v) else
                             (repr(v) if isinstance(v, float) else v)) for k, v in row.items()})
    return buf.getvalue()


def _num(v, pct: bool = False) -> str:
    if not isinstance(v, float) or not math.isfinite(v):
        return "-"
    return f"{100 * v:.1f}%" if pct else f"{v:.4f}"


def markdown_table(rows: list[dict]) -> str:
    head = ["method", "n"] + [f"barrier {k}" for k in STATS[1:]] + [f"acc@0.5 {k}" for k in STATS[1:]]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|"]
    for r in rows:
        cells = [r["method"], str(r["n"])] + [_num(r[f"barrier_{k}"]) for k in STATS[1:]] + \
                [_num(r[f"acc_mid_{k}"], pct=True) for k in STATS[1:]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def simplex_markdown_table(rows: list[dict]) -> str:
    head = ["method", "n"] + [f"centroid excess {k}" for k in ("median", "min", "max")] + \
        [f"centroid acc {k}" for k in ("median", "min", "max")] + ["worst sample median"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|"]
    for r in rows:
        cells = [r["method"], str(r["n"])] + [_num(r[f"centroid_{k}"]) for k in ("median", "min", "max")] + \
                [_num(r[f"centroid_acc_{k}"], pct=True) for k in ("median", "min", "max")] + [_num(r["worst_median"])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _json_lines(head: bytes) -> bool:
    import json

    lines = head.decode("utf-8", errors="ignore").splitlines()
    lines = lines[:-1] if len(head) == _HEAD else lines  # the last line may be cut
    try:
        return all(isinstance(r := json.loads(line), dict) and "key" in r for line in lines)
    except ValueError:
        return False


def _grid_json(head: bytes) -> bool:
    import json

    try:
        obj = json.loads(head.decode("utf-8", errors="ignore"))
    except ValueError:
        return len(head) == _HEAD and head.lstrip().startswith(b'{') and b'"kind": "grid"' in head
    return isinstance(obj, dict) and obj.get("kind") == "grid"


_HEAD = 1 << 16
_PNG = b"\x89PNG\r\n\x1a\n"
#: every file a grid writes at the top of its folder, with a test of its first bytes: a file there that
#: fails it was not written by a grid, and is not overwritten
REPORT_FILES = {
    "results.jsonl": _json_lines,
    "summary.csv": lambda head: head.startswith(b"method,n,"),
    "summary_simplex.csv": lambda head: head.startswith(b"method,n,"),
    "summary.md": lambda head: head.startswith(b"# Grid summary\n"),
    "barriers.png": lambda head: head.startswith(_PNG),
    "curves.png": lambda head: head.startswith(_PNG),
    "grid.json": _grid_json,
}


def foreign_report_file(path: Path) -> bool:
    """Whether `path` (one of REPORT_FILES) exists and holds something a grid did not write."""
    if not path.exists() and not path.is_symlink():
        return False
    if path.is_symlink() or not path.is_file():
        return True
    try:
        with open(path, "rb") as f:
            head = f.read(_HEAD)
        return not REPORT_FILES[path.name](head)
    except (OSError, UnicodeDecodeError):
        return True


def write_reports(records: list[dict], spec, out: Path) -> list[dict]:
    """Every output of rank 0; returns the summary rows of the pairs (simplex rows: summary_simplex.csv)."""
    from .plots import plot_barriers, plot_grid_curves

    _write_text(out / "results.jsonl", "".join(json_text(r, indent=None) for r in records))
    pairs = pair_records(records)
    rows = summarise(pairs, spec.methods)
    _write_text(out / "summary.csv", _csv(rows))
    title = (f"{len(spec.pairs)} pairs on {spec.data} ({spec.split}), {len(spec.lambdas)} lambdas; "
             "loss barrier and accuracy at lambda = 0.5")
    text = f"# Grid summary\n\n{title}\n\n{markdown_table(rows)}"
    if spec.simplex_groups:
        srows = summarise(simplex_records(records), spec.simplex_methods, SIMPLEX_QUANTITIES)
        _write_text(out / "summary_simplex.csv", _csv(srows))
        text += (f"\n## Simplex\n\n{len(spec.simplex_groups)} groups of {len(spec.simplex_groups[0])}+ models, "
                 f"the others aligned to the first; the centroid's loss minus the models' mean loss, its accuracy, "
                 f"and the worst of {spec.simplex_samples} Dirichlet({spec.simplex_alpha:g}) samples\n\n"
                 f"{simplex_markdown_table(srows)}")
    _write_text(out / "summary.md", text)
    plot_barriers(pairs, spec.methods, out / "barriers.png")
    plot_grid_curves(pairs, spec.methods, out / "curves.png")
    return rows


__all__ = ["REPORT_FILES", "SIMPLEX_QUANTITIES", "foreign_report_file", "markdown_table", "pair_records", "simplex_markdown_table", "simplex_records",
           "summarise", "write_reports"]
