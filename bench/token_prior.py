"""Token-frequency prior of weight matching on the 8 cached Shakespeare GPT-2 pairs.

`lf.align(a, b, "weight")` against `lf.align(a, b, "weight", token_counts=counts)`, the counts
taken from the recipe's training split (most of the 256 bytes never occur in it). Pairs: seeds
(0,1), (2,3), (4,5), (6,7) trained with the AVX-512 and the AVX2 kernels by
bench/real_data_pairs.py (cached under --cache/<capability>/; nothing is trained here). Test
data and lambdas as there: the first 384 test blocks in batches of 128, 7 lambdas.

    nice -n 10 python bench/token_prior.py
Writes bench/results/token_prior.json and prints per pair and median [min, max].
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
from lmc_fast.data import loader  # noqa: E402
from lmc_fast.io import load_model  # noqa: E402
from lmc_fast.recipes import recipe  # noqa: E402

LAMBDAS = 7
VARIANTS = ("default", "token_prior")


def training_counts(train) -> torch.Tensor:
    return torch.bincount(train.ids.reshape(-1), minlength=train.vocab_size)


def pair_record(cap: str, seeds, cache: Path, counts, test) -> dict:
    a, b = (load_model(cache / cap / f"gpt2-shakespeare-seed{s}") for s in seeds)
    rec = {"capability": cap, "seeds": list(seeds)}
    for name, kw in (("default", {}), ("token_prior", {"token_counts": counts})):
        al = lf.align(a, b, "weight", **kw)
        rec[name] = {"barrier": lf.barrier(a, al.apply(b), test, LAMBDAS).barrier,
                     "iterations": al.info["iterations"], "seconds": al.info["seconds"]}
    return rec


def summary(records: list[dict]) -> dict:
    out = {}
    for name in VARIANTS:
        values = [r[name]["barrier"] for r in records]
        out[name] = {"median": statistics.median(values), "min": min(values), "max": max(values)}
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cache", default="/tmp/lmc_fast_pairs", help="trained pairs (bench/real_data_pairs.py)")
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "token_prior.json"))
    args = p.parse_args()
    torch.set_num_threads(1)
    train, test_ds = recipe("gpt2-shakespeare").datasets()
    counts = training_counts(train)
    test = list(loader(test_ds.subset(range(384)), 128))
    records = []
    for cap in ("AVX512", "AVX2"):
        for i in range(4):
            records.append(pair_record(cap, (2 * i, 2 * i + 1), Path(args.cache), counts, test))
            r = records[-1]
            print(cap, r["seeds"], " ".join(f"{k}={r[k]['barrier']:.4f}" for k in VARIANTS), flush=True)
    result = {"kind": "token_prior", "machine": cpu_model(), "torch": torch.__version__, "torch_threads": 1,
              "load_average": os.getloadavg(), "tokens_never_seen": int((counts == 0).sum()),
              "vocab_size": len(counts), "summary": summary(records), "records": records}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    for name, s in result["summary"].items():
        print(f"{name:12s} {s['median']:.4f} [{s['min']:.4f}, {s['max']:.4f}]")
    print(f"-> {out}")


if __name__ == "__main__":
    main()
