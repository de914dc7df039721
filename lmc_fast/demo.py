"""`lmc-fast demo`: two ViTs from different seeds, every alignment method, one table and one figure.

Trains two reference ViTs (recipe "vit-digits": scikit-learn's bundled 8x8 digits) from seeds
0 and 1, aligns the second to the first with every method, sweeps the linear path between
them on the test split, and writes into `out`:

    results.json           every curve, timing, the machine and the date
    curves.png             loss / accuracy against lambda for every method (chords dashed)
    models/seed{0,1}/      the two trained checkpoints (usable with `lmc-fast sweep/align/merge`)
    alignments/*.safetensors

Methods: "none" (raw parameters, the baseline every paper reports), "permutation" (Git
Re-Basin weight matching on raw parameters, also swept in raw space), and "weight",
"activation", "learned" (every Transformer symmetry; swept in canonical space).
"""
from __future__ import annotations

import dataclasses
import datetime
import os
import sys
import time
from pathlib import Path

import torch

from .machine import machine_info
from .match.methods import METHODS, REGISTRY
DATASETS = {"digits": "vit-digits", "fashion-mnist": "vit-fashion-mnist"}
#: Said wherever a --quick run's numbers appear: its models are tiny and barely trained.
QUICK_NOTE = ("QUICK RUN (--quick): tiny models (width 16, one layer) barely trained on 256 images; "
              "the numbers only show that the set-up works and mean nothing")


def demo_outputs(out, seeds=(0, 1), methods=METHODS) -> list[tuple[str, Path]]:
    """("folder" | "file", path) of everything `run_demo(out)` writes (for checks before it starts)."""
    out = Path(out)
    entries = [("folder", out / "models" / f"seed{s}") for s in seeds]
    entries += [("file", out / "alignments" / f"{m}.safetensors") for m in methods if m != "none"]
    return entries + [("file", out / "results.json"), ("file", out / "curves.png")]


def _quick_recipe(r, data: str):
    """Tiny settings for tests: a 1-layer width-16 ViT, 8 steps on 256 images, 256 test images."""
    cfg = dataclasses.replace(r.model_config, d_model=16, n_layer=1, n_head=2, d_mlp=32)
    train_ds, test_ds = r.datasets()
    train_ds, test_ds = train_ds.subset(range(min(256, len(train_ds)))), test_ds.subset(range(min(256, len(test_ds))))
    small = dataclasses.replace(r, model_config=cfg, data=lambda: (train_ds, test_ds))
    return small.with_hparams(epochs=2, batch_size=64)


def _device_batches(batches, device):
    out = []
    for x, y in batches:
        out.append((x.to(device), y.to(device)))
    return out


# 40 epochs rather than the recipe's 20: 20-epoch digits pairs reach ~95% but are barely
# converged, and their barriers barely respond to matching (see tests/test_real_data.py).
DIGITS_EPOCHS = 40
#: Learned-matching steps: 3000 on CUDA; on CPU 2000 on digits (about 2 minutes), 300 on
#: Fashion-MNIST (its model and data make each step ~10x slower).
LEARNED_STEPS = {"cuda": 3000, "digits": 2000, "fashion-mnist": 300}
#: Learned matching in the demo: the end models fit their training images, so each mixture
#: is fitted to the end models' mixed predictions on Mixup blends, with lambda ~ U[0, 1]
#: (tests/test_real_data.py has the measurements behind this choice).
LEARNED_SETTINGS = dict(lr=1e-2, lam="uniform", lambdas_per_step=2, target="endpoints", eval_every=100,
                        val_fraction=0.2)


def run_demo(out="demo_out", *, data: str = "digits", device: str = "cpu", quick: bool = False,
             learned_steps: int | None = None, lambdas: int | None = None, epochs: float | None = None,
             seeds=(0, 1), methods=METHODS, progress: bool = True, log=None) -> dict:
    """Run the demo; returns the JSON-ready result (also written to `out/results.json`).

    Defaults: 40 training epochs on digits (the recipe's own on Fashion-MNIST), 25 lambdas,
    learned-matching steps from LEARNED_STEPS; `quick` shrinks everything for tests."""
    import lmc_fast as lf

    from .data import loader
    from .io import save_model, write_json
    from .plots import plot_curves
    from .recipes import recipe
    from .train import train

    def say(msg):
        if log is not None:
            log(msg)

    if data not in DATASETS:
        raise ValueError(f"demo data must be one of {sorted(DATASETS)}, got {data!r}")
    unknown = set(methods) - set(METHODS)
    if unknown:
        raise ValueError(f"unknown methods {sorted(unknown)}; choose from {METHODS}")
    if len(seeds) != 2:
        raise ValueError("the demo needs exactly two seeds")
    if str(device).startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available to this torch")
    t_start = time.perf_counter()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    r = recipe(DATASETS[data])
    if data == "digits" and not quick:
        r = r.with_hparams(epochs=DIGITS_EPOCHS)
    if quick:
        r = _quick_recipe(r, data)
    if epochs is not None:
        r = r.with_hparams(epochs=epochs)
    if learned_steps is None:
        learned_steps = 10 if quick else LEARNED_STEPS["cuda" if str(device).startswith("cuda") else data]
    lambdas = lambdas if lambdas is not None else (9 if quick else 25)
    train_ds, test_ds = r.datasets()
    if quick:
        say(QUICK_NOTE)
    say(f"data: {data} ({len(train_ds)} train / {len(test_ds)} test images); model: ViT "
        f"d={r.model_config.d_model} layers={r.model_config.n_layer} heads={r.model_config.n_head} "
        f"mlp={r.model_config.d_mlp}; device: {device}")

    # ---- 1. two models from different seeds
    models, histories = [], []
    for s in seeds:
        m = r.model(seed=s).to(device)
        say(f"training seed {s} ({r.hparams})")
        h = train(m, **r.train_kwargs, seed=s, device=device, progress=progress)
        m.eval()
        acc = h.get("eval", {}).get("acc")
        say(f"  seed {s}: {h['steps']} steps in {h['seconds']:.1f} s, test acc {acc:.3f}" if acc is not None else
            f"  seed {s}: {h['steps']} steps in {h['seconds']:.1f} s")
        save_model(m, out / "models" / f"seed{s}", metadata={"recipe": r.name, "data": data, "seed": s, "train": h})
        models.append(m)
        histories.append(h)
    a, b = models
    test = loader(test_ds, r.eval_batch_size)
    match_batches = _device_batches(loader(train_ds, r.batch_size, shuffle=True, seed=1234), device)

    # ---- 2. align with every method, 3. sweep
    results, rows, align_meta = {}, [], {}
    weight_al, weight_seconds = None, 0.0
    (out / "alignments").mkdir(exist_ok=True)
    for method in METHODS:
        if method not in methods:
            continue
        say(f"{method}: aligning" if method != "none" else "none: raw parameters")
        t0 = time.perf_counter()
        space = REGISTRY[method].space
        if method == "none":
            al, b_al = None, b
        elif method != "learned":
            al = lf.align(a, b, method, data=match_batches if REGISTRY[method].needs_data else None,
                          progress=progress)
            b_al = al.apply(b)
        else:
            init = weight_al
            extra = 0.0
            if init is None:
                t1 = time.perf_counter()
                init = lf.align(a, b, "weight")
                extra = time.perf_counter() - t1
            else:
                extra = weight_seconds
            from .data.augment import Mixup

            kw = {**LEARNED_SETTINGS, **(dict(eval_every=5) if quick else {})}
            al = lf.align(a, b, "learned", data=match_batches, steps=learned_steps, init=init, augment=Mixup(1.0),
                          progress=progress, **kw)
            b_al = al.apply(b)
            t0 -= extra  # time to obtain this alignment includes its weight-matching start
        align_seconds = time.perf_counter() - t0
        if method == "weight":
            weight_al, weight_seconds = al, align_seconds
        if al is not None:
            al.save(out / "alignments" / f"{method}.safetensors")
        res = lf.barrier(a, b_al, test, lambdas=lambdas, space=space, progress=progress)
        mid = res.at(0.5)
        results[method] = res.to_dict()
        info = dict(al.info) if al is not None else {}
        info.pop("val_history", None)
        align_meta[method] = {"seconds": align_seconds, "space": space, "info": info}
        if method == "learned":
            align_meta[method]["steps"] = learned_steps
            align_meta[method]["includes_weight_init_seconds"] = True
        rows.append({"method": method, "loss_barrier": res.barrier, "acc_barrier": res.acc_barrier,
                     "signed_min": res.signed_min, "loss_mid": mid["loss"], "acc_mid": mid["acc"],
                     "align_seconds": align_seconds, "sweep_seconds": res.seconds})
        say(f"  {method}: loss barrier {res.barrier:.4f}, acc at 0.5 {mid['acc']:.3f} "
            f"(align {align_seconds:.1f} s, sweep {res.seconds:.1f} s)")

    first = next(iter(results.values()))
    result = {
        "kind": "demo", "data": data, "recipe": r.name, "quick": quick, "seeds": list(seeds),
        **({"note": QUICK_NOTE} if quick else {}),
        "model_config": r.model_config.to_dict(), "train_hparams": r.hparams,
        "lambdas": lambdas, "learned_steps": learned_steps, "test_examples": len(test_ds),
        "end_points": {k: first[k] for k in ("loss_a", "loss_b", "acc_a", "acc_b")},
        "train": histories, "table": rows, "results": results, "alignment": align_meta,
        "machine": machine_info(device), "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": " ".join([os.path.basename(sys.argv[0])] + sys.argv[1:]) if sys.argv else None,
    }
    title = f"two ViTs on {data} (seeds {seeds[0]}, {seeds[1]}): linear paths after alignment"
    if quick:
        title += "\nQUICK RUN: barely trained models, the numbers mean nothing"
    plot_curves(results, out / "curves.png", title=title)
    result["total_seconds"] = time.perf_counter() - t_start
    write_json(out / "results.json", result)
    return result


def format_table(rows) -> str:
    """The demo's table as aligned text (also valid Markdown)."""
    head = ["method", "loss barrier", "acc barrier", "acc @ 0.5", "align s", "sweep s"]
    body = [[r["method"], f"{r['loss_barrier']:.4f}", f"{100 * r['acc_barrier']:.1f}%", f"{100 * r['acc_mid']:.1f}%",
             f"{r['align_seconds']:.1f}", f"{r['sweep_seconds']:.1f}"] for r in rows]
    widths = [max(len(c) for c in col) for col in zip(head, *body)]

    def line(cells):
        return "| " + " | ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))) + " |"

    sep = "|" + "|".join(("-" * (w + 1) + ":") if i else ("-" * (w + 2)) for i, w in enumerate(widths)) + "|"
    return "\n".join([line(head), sep] + [line(b) for b in body])
