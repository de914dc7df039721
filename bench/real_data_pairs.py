"""Which real-data claims hold for every trained pair, on this CPU's instruction set?

Training is not bit-identical across instruction sets (AVX2 vs AVX-512), so the pair a test
trains differs per machine. This script trains several independent pairs with exactly the
recipes of tests/test_real_data.py and records, per pair, every quantity those tests assert
on. A test may assert only what holds for every pair here, on both instruction sets:

    python bench/real_data_pairs.py                                  # this CPU's best kernels
    ATEN_CPU_CAPABILITY=avx2 python bench/real_data_pairs.py         # the AVX2 kernels

Writes bench/results/real_data_pairs_<capability>.json (one record per pair) and prints a table.
Models are cached under --cache (re-runs skip training).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import cpu_model  # noqa: E402

import lmc_fast as lf  # noqa: E402
from lmc_fast.io import load_model, save_model  # noqa: E402
from lmc_fast.recipes import recipe  # noqa: E402
from lmc_fast.train import train  # noqa: E402

DIGITS_EPOCHS = 40  # as tests/test_real_data.py
SHAKESPEARE_STEPS = 300


def trained(rec, seed: int, cache: Path, **train_kw):
    path = cache / f"{rec.name}-seed{seed}"
    if (path / "config.json").is_file():
        return load_model(path)
    m = rec.model(seed=seed)
    train(m, **{**rec.train_kwargs, **train_kw}, seed=seed, progress=False)
    save_model(m.eval(), path)
    return m.eval()


def permutation_without_heads(a, b, test, lambdas) -> float:
    """The older permutation baseline: residual and MLP permutations, attention heads left alone."""
    return lf.barrier(a, lf.align(a, b, "permutation", heads=False).apply(b), test, lambdas, space="raw").barrier


def digits_pair(seeds, cache: Path, learned_steps: list[int]) -> dict:
    from lmc_fast.data.augment import Mixup

    r = recipe("vit-digits").with_hparams(epochs=DIGITS_EPOCHS)
    a, b = (trained(r, s, cache) for s in seeds)
    train_loader, test_loader = r.loaders(seed=0)
    train_batches, test = list(train_loader), list(test_loader)
    rec = {"setting": "vit-digits", "seeds": list(seeds),
           "acc": [lf.evaluate(m, test)["acc"] for m in (a, b)]}
    rec["none"] = lf.barrier(a, b, test, 11, space="raw").barrier
    aligned = {}
    for method, space in (("permutation", "raw"), ("weight", "canonical"), ("activation", "canonical")):
        al = lf.align(a, b, method, data=train_batches)
        aligned[method] = al
        rec[method] = lf.barrier(a, al.apply(b), test, 11, space=space).barrier
    rec["permutation_no_heads"] = permutation_without_heads(a, b, test, 11)
    rec["weight_iterations"] = aligned["weight"].info["iterations"]
    for steps in learned_steps:  # the recipe of tests/test_real_data.py, at each step count
        t0 = time.perf_counter()
        al = lf.align(a, b, "learned", data=train_batches, init=aligned["weight"], steps=steps, lr=1e-2,
                      lam="uniform", lambdas_per_step=2, target="endpoints", augment=Mixup(1.0), eval_every=100,
                      val_fraction=0.2, seed=0)
        rec[f"learned_{steps}"] = lf.barrier(a, al.apply(b), test, 11).barrier
        rec[f"learned_{steps}_seconds"] = time.perf_counter() - t0
        rec[f"learned_{steps}_val_improved"] = al.info["val_barrier"] <= al.info["val_history"][0][1]
    return rec


def shakespeare_pair(seeds, cache: Path) -> dict:
    from lmc_fast.data import loader

    r = recipe("gpt2-shakespeare").with_hparams(steps=SHAKESPEARE_STEPS)
    _, test_ds = r.datasets()
    a, b = (trained(r, s, cache, eval_data=None) for s in seeds)
    test = list(loader(test_ds.subset(range(384)), 128))
    rec = {"setting": "gpt2-shakespeare", "seeds": list(seeds)}
    rec["none"] = lf.barrier(a, b, test, 7, space="raw").barrier
    rec["permutation"] = lf.barrier(a, lf.align(a, b, "permutation").apply(b), test, 7, space="raw").barrier
    rec["permutation_no_heads"] = permutation_without_heads(a, b, test, 7)
    rec["weight"] = lf.barrier(a, lf.align(a, b, "weight").apply(b), test, 7).barrier
    return rec


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=4, help="independent pairs: seeds (0,1), (2,3), ... (default 4)")
    p.add_argument("--learned-steps", type=int, nargs="*", default=[300, 2000],
                   help="learned matching runs, by step count (default 300 2000; none: skip)")
    p.add_argument("--settings", nargs="+", default=["vit-digits", "gpt2-shakespeare"])
    p.add_argument("--cache", default="/tmp/lmc_fast_pairs", help="trained models (default /tmp/lmc_fast_pairs)")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    torch.set_num_threads(1)  # as the test suite (tests/conftest.py)
    cap = torch.backends.cpu.get_cpu_capability()
    cache = Path(args.cache) / cap
    out = Path(args.out or Path(__file__).parent / "results" / f"real_data_pairs_{cap.lower()}.json")
    records = []
    for i in range(args.pairs):
        seeds = (2 * i, 2 * i + 1)
        if "vit-digits" in args.settings:
            records.append(digits_pair(seeds, cache, args.learned_steps))
            print(json.dumps(records[-1]), flush=True)
        if "gpt2-shakespeare" in args.settings:
            records.append(shakespeare_pair(seeds, cache))
            print(json.dumps(records[-1]), flush=True)
    result = {"kind": "real_data_pairs", "cpu_capability": cap, "aten_cpu_capability_env":
              os.environ.get("ATEN_CPU_CAPABILITY"), "machine": cpu_model(), "torch": torch.__version__, "torch_threads": 1,
              "digits_epochs": DIGITS_EPOCHS, "shakespeare_steps": SHAKESPEARE_STEPS, "records": records}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    cols = ["none", "permutation", "weight", "activation"] + [f"learned_{s}" for s in args.learned_steps]
    print(f"{'setting':18s} {'seeds':7s} " + " ".join(f"{c:>11s}" for c in cols))
    for r in records:
        print(f"{r['setting']:18s} {str(tuple(r['seeds'])):7s} "
              + " ".join(f"{r[c]:11.4f}" if c in r else f"{'-':>11s}" for c in cols))
    print(f"-> {out}")


if __name__ == "__main__":
    main()
