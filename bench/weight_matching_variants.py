"""Weight matching variants on the 16 cached real-data pairs: which one lowers the barrier?

Pairs: ViTs on digits and GPT-2s on Shakespeare, seeds (0,1), (2,3), (4,5), (6,7), trained
with the AVX-512 and with the AVX2 kernels by bench/real_data_pairs.py (cached under
--cache/<capability>/; nothing is trained here). Test data and lambdas exactly as there.

Variants of `weight_matching` (match/weight.py):
  default            weighting="sum", init="anchor", structured order
  per_tensor         weighting="per_tensor" (sum of per-tensor cosines)
  identity_start     init="identity" (no anchor start)
  per_tensor_identity both
  sqrt               weighting="sqrt" (each term divided by sqrt(||A_p|| ||B_p||))
  anchor_per_tensor  init="anchor_per_tensor" (anchor tensors counted equally in the start)
  converged          tol=0, max_iter=200 (sweeps until the objective stops rising at all)
  best_of_4          the default plus 3 random-order restarts, keeping the highest objective
Per pair it also records the unaligned barrier in raw and in canonical space (identity
alignment); per variant the objective, sweeps, and where on the path the barrier peaks; for
the 4 restarts each objective and barrier with their Spearman rank correlation; and for the
default run the cosine of A with g.B per parameter group (embeddings, each block, head).

    nice -n 10 python bench/weight_matching_variants.py
Writes bench/results/weight_matching_variants.json and prints per setting median [min, max].
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import cpu_model  # noqa: E402

import lmc_fast as lf  # noqa: E402
from lmc_fast.io import load_model  # noqa: E402
from lmc_fast.match.align import params_pair  # noqa: E402
from lmc_fast.match.weight import weight_matching  # noqa: E402
from lmc_fast.recipes import recipe  # noqa: E402
from lmc_fast.symmetry import Alignment  # noqa: E402

VARIANTS = {
    "default": {},
    "per_tensor": {"weighting": "per_tensor"},
    "identity_start": {"init": "identity"},
    "per_tensor_identity": {"weighting": "per_tensor", "init": "identity"},
    "sqrt": {"weighting": "sqrt"},
    "anchor_per_tensor": {"init": "anchor_per_tensor"},
    "converged": {"tol": 0.0, "max_iter": 200},
}
RESTARTS = 4


def test_data(setting: str):
    """The test batches and lambdas of bench/real_data_pairs.py."""
    if setting == "vit-digits":
        return list(recipe("vit-digits").loaders(seed=0)[1]), 11
    from lmc_fast.data import loader

    _, test_ds = recipe("gpt2-shakespeare").datasets()
    return list(loader(test_ds.subset(range(384)), 128)), 7


def barrier_record(a, b, test, lambdas, space="canonical") -> dict:
    r = lf.barrier(a, b, test, lambdas, space=space)
    peak = max(range(len(r.signed)), key=lambda i: r.signed[i])
    return {"barrier": r.barrier, "peak_lambda": r.lambdas[peak]}


def matched(spec, pa, pb, **kw):
    elements, info = weight_matching(spec, pa, pb, **kw)
    return Alignment(spec, elements, info), info


def restarts(spec, pa, pb):
    """The default run and RESTARTS - 1 random-order runs."""
    return [matched(spec, pa, pb)] + [matched(spec, pa, pb, order="random", seed=s) for s in range(1, RESTARTS)]


def ranks(values):
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0] * len(values)
    for rank, i in enumerate(order):
        out[i] = rank
    return out


def spearman(x, y) -> float:
    rx, ry = ranks(x), ranks(y)
    mx, my = statistics.mean(rx), statistics.mean(ry)
    num = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    den = (sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry)) ** 0.5
    return num / den if den else float("nan")


def group_of(name: str) -> str:
    """blocks.<l>, or the top-level module (embeddings, head, final norm)."""
    parts = name.split(".")
    return ".".join(parts[:2]) if parts[0] == "blocks" else parts[0]


def group_cosines(pa, gb) -> dict:
    """Per parameter group: sum_p <A_p, (g.B)_p> / sum_p ||A_p|| ||B_p|| (1 = aligned exactly)."""
    sums = {}
    for n in pa:
        inner, norms = sums.get(group_of(n), (0.0, 0.0))
        sums[group_of(n)] = (inner + float((pa[n] * gb[n]).sum()), norms + float(pa[n].norm() * gb[n].norm()))
    return {g: inner / norms for g, (inner, norms) in sums.items() if norms > 0}


def pair_record(setting: str, cap: str, seeds, cache: Path, test, lambdas) -> dict:
    a, b = (load_model(cache / cap / f"{setting}-seed{s}") for s in seeds)
    spec, pa, pb = params_pair(a, b, "canonical")
    rec = {"setting": setting, "capability": cap, "seeds": list(seeds),
           "raw_identity": barrier_record(a, b, test, lambdas, "raw"),
           "canonical_identity": barrier_record(a, b, test, lambdas)}
    runs = {name: matched(spec, pa, pb, **kw) for name, kw in VARIANTS.items()}
    tries = restarts(spec, pa, pb)
    runs["best_of_4"] = max(tries, key=lambda run: run[1]["objective"][-1])
    for name, (al, info) in runs.items():
        rec[name] = {**barrier_record(a, al.apply(b), test, lambdas), "objective": info["objective"][-1],
                     "objective_identity": info["objective_identity"], "iterations": info["iterations"],
                     "order": info["order"]}
    objectives = [info["objective"][-1] for _, info in tries]
    barriers = [lf.barrier(a, al.apply(b), test, lambdas).barrier for al, _ in tries]
    rec["restarts"] = {"objective": objectives, "barrier": barriers, "spearman": spearman(objectives, barriers)}
    rec["default_group_cosines"] = group_cosines(pa, runs["default"][0].apply_params(pb))
    return rec


def summary(records: list[dict]) -> dict:
    out = {}
    for setting in sorted({r["setting"] for r in records}):
        rows = [r for r in records if r["setting"] == setting]
        out[setting] = {}
        for name in ["raw_identity", "canonical_identity", *VARIANTS, "best_of_4"]:
            values = [r[name]["barrier"] for r in rows]
            out[setting][name] = {"median": statistics.median(values), "min": min(values), "max": max(values)}
        out[setting]["restarts_spearman_median"] = statistics.median(r["restarts"]["spearman"] for r in rows)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cache", default="/tmp/lmc_fast_pairs", help="trained pairs (bench/real_data_pairs.py)")
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "weight_matching_variants.json"))
    args = p.parse_args()
    torch.set_num_threads(1)
    records = []
    for setting in ("vit-digits", "gpt2-shakespeare"):
        test, lambdas = test_data(setting)
        for cap in ("AVX512", "AVX2"):
            for i in range(4):
                records.append(pair_record(setting, cap, (2 * i, 2 * i + 1), Path(args.cache), test, lambdas))
                r = records[-1]
                print(setting, cap, r["seeds"], " ".join(f"{k}={r[k]['barrier']:.3f}" for k in r
                                                         if isinstance(r[k], dict) and "barrier" in r[k]
                                                         and not isinstance(r[k]["barrier"], list)), flush=True)
    result = {"kind": "weight_matching_variants", "machine": cpu_model(), "torch": torch.__version__,
              "torch_threads": 1, "load_average": os.getloadavg(), "variants": {**VARIANTS, "best_of_4": {
                  "restarts": RESTARTS}}, "summary": summary(records), "records": records}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    for setting, rows in result["summary"].items():
        for name, s in rows.items():
            if not isinstance(s, dict):
                print(f"{setting:18s} {name}: {s:.2f}")
                continue
            print(f"{setting:18s} {name:20s} {s['median']:.3f} [{s['min']:.3f}, {s['max']:.3f}]")
    print(f"-> {out}")


if __name__ == "__main__":
    main()
