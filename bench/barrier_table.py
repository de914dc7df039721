"""Barrier table for one pair of independently trained models: none / permutation / weight /
activation / learned, with accuracies, iterations and seconds (the tables in README).

    python bench/barrier_table.py --pair digits|fashion|gpt2 [--learned-steps 300] [--learned task|distill] [--lambdas 11]

Trains the pair from the recipe (seeds 0 and 1), aligns with every method, sweeps the test
subset and writes bench/results/barriers_<pair>.json. `--train-override epochs=1` (or
steps=20) shrinks the training for a smoke run.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

import lmc_fast as lf
from lmc_fast.data import loader
from lmc_fast.recipes import recipe
from lmc_fast.train import train

PAIRS = {  # recipe, training overrides, test examples, statistics / learning examples, batch
    "digits": ("vit-digits", {"epochs": 40}, None, None, 64),
    "fashion": ("vit-fashion-mnist", {}, 2000, 4096, 128),
    "gpt2": ("gpt2-shakespeare", {"steps": 400}, 512, 2048, 64),
}


LEARNED = {
    "task": dict(lr=1e-2, lambdas_per_step=2, eval_every=25, patience=8),
    "distill": dict(lr=1e-2, lambdas_per_step=2, eval_every=100, lam="uniform", target="endpoints", val_fraction=0.2),
}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", choices=sorted(PAIRS), default="digits")
    ap.add_argument("--lambdas", type=int, default=11)
    ap.add_argument("--learned-steps", type=int, default=300)
    ap.add_argument("--learned", choices=sorted(LEARNED), default="task",
                    help="task: labels, lambda ~ U[0.4, 0.6]; distill: end-model targets, lambda ~ U[0, 1] "
                         "(with Mixup on images)")
    ap.add_argument("--train-override", nargs="*", default=[], metavar="KEY=VALUE")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    name, overrides, n_test, n_train, batch = PAIRS[args.pair]
    for kv in args.train_override:
        k, v = kv.split("=", 1)
        overrides = {**{o: w for o, w in overrides.items() if o not in ("epochs", "steps")}, k: int(v)}
    r = recipe(name, **overrides)
    train_ds, test_ds = r.datasets()
    t0 = time.perf_counter()
    models = []
    for seed in (0, 1):
        m = r.model(seed=seed)
        train(m, **{**r.train_kwargs, "eval_data": None}, seed=seed, progress=False)
        models.append(m.eval())
    train_s = time.perf_counter() - t0
    a, b = models
    test = list(loader(test_ds.subset(range(n_test)) if n_test else test_ds, 500 if n_test is None or n_test > 512 else 128))
    stats = list(loader(train_ds.subset(range(n_train)) if n_train else train_ds, batch, shuffle=True, seed=0))
    rows, weight = [], None
    for method in ("none", "permutation", "weight", "activation", "learned"):
        t = time.perf_counter()
        if method == "none":
            b2, info, space = b, {}, "raw"
        else:
            kw = {"data": stats}
            if method == "learned":
                kw.update(steps=args.learned_steps, init=weight, **LEARNED[args.learned])
                if args.learned == "distill" and args.pair != "gpt2":
                    from lmc_fast.data.augment import Mixup

                    kw["augment"] = Mixup(1.0)
            al = lf.align(a, b, method, **kw)
            weight = al if method == "weight" else weight
            b2, info, space = al.apply(b), al.info, "raw" if method == "permutation" else "canonical"
        align_s = time.perf_counter() - t
        res = lf.barrier(a, b2, test, args.lambdas, space=space)
        rows.append({"method": method, "loss_barrier": res.barrier, "acc_barrier": res.acc_barrier,
                     "acc_mid": res.at(0.5)["acc"], "iterations": info.get("iterations"), "steps": info.get("steps"),
                     "align_seconds": align_s, "acc_a": res.acc_a, "acc_b": res.acc_b})
        print(f"{method:<12} barrier {res.barrier:8.4f}  acc@0.5 {res.at(0.5)['acc']:.4f}  "
              f"iters {info.get('iterations', info.get('steps', '-'))}  {align_s:.1f}s", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"barriers_{args.pair}{'' if args.learned == 'task' else '_' + args.learned}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"pair": args.pair, "recipe": name, "overrides": overrides, "train_seconds": train_s,
                               "lambdas": args.lambdas, "learned_settings": {"name": args.learned, **LEARNED[args.learned]},
                               "test_examples": len(test_ds) if n_test is None else n_test,
                               "rows": rows, "date": time.strftime("%Y-%m-%d")}, indent=1))
    tmp.replace(path)
    print("->", path)


if __name__ == "__main__":
    main()
