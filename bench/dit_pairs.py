"""DiT barrier table: tiny class-conditional DiTs trained from different seeds on 8x8 digits and on Fashion-MNIST
(downscaled to 8x8), 5 independent pairs of each, every matching method; loss = noise-prediction MSE at fixed
draws of (timestep, noise) on the test images.

    python bench/dit_pairs.py train --dataset digits --seeds 0-9      # models cached under data_cache/dit/
    python bench/dit_pairs.py table --dataset digits [--learned-steps 300]
    python bench/dit_pairs.py hybrid                                   # digits DiT x Fashion DiT, PNG grid
    python bench/dit_pairs.py objective --dataset digits               # weight matching's objective, per pair

`table` writes bench/results/dit_barriers_<dataset>.json (per pair and method: the barrier curve, seconds; per
method the median and range over the pairs); `hybrid` writes bench/results/dit_hybrid.json and
docs/dit_hybrid.png (images sampled from the same noise along the raw and the aligned path).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

import lmc_fast as lf
from lmc_fast.diffusion import DenoisingBatches, images_8x8, sample, train_dit
from lmc_fast.io import load_model, save_model
from lmc_fast.models import DiT, DiTConfig

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / "data_cache" / "dit"
RESULTS = Path(__file__).resolve().parent / "results"
#: every method, plus two controls: "canonical" (no alignment, interpolated in canonical space: what the
#: canonical form alone changes) and "weight-per-tensor" (weight matching with every tensor counted equally)
METHODS = ("none", "canonical", "permutation", "weight", "weight-per-tensor", "activation", "learned")
RAW = ("none", "permutation")  # interpolated in raw space
TRAIN = dict(steps=1500, batch_size=128, lr=1e-3)
N_TEST, N_STATS = 1024, 1024


def seeds(text: str) -> list[int]:
    lo, _, hi = text.partition("-")
    return list(range(int(lo), int(hi or lo) + 1))


def model_path(dataset: str, seed: int) -> Path:
    return CACHE / f"{dataset}-seed{seed}"


def trained(dataset: str, seed: int, wait: bool = False) -> DiT:
    """The cached model, or one trained now (the same seed gives the same model on the same machine);
    `wait`: another process is training it, wait for its checkpoint instead."""
    path = model_path(dataset, seed)
    while wait and not (path / "config.json").exists():
        time.sleep(10)
    if (path / "config.json").exists():
        return load_model(path).eval()
    x, y = images_8x8(dataset, "train", limit=20000 if dataset == "fashion" else None)
    torch.manual_seed(seed)
    model = DiT(DiTConfig.tiny())
    t0 = time.perf_counter()
    losses = train_dit(model, x, y, seed=seed, **TRAIN)
    save_model(model, path, metadata={"dataset": dataset, "seed": seed, **TRAIN,
                                      "final_loss": sum(losses[-100:]) / 100, "train_seconds": time.perf_counter() - t0})
    print(f"{dataset} seed {seed}: final loss {sum(losses[-100:]) / 100:.4f} in {time.perf_counter() - t0:.0f} s",
          flush=True)
    return model.eval()


def test_batches(dataset: str) -> DenoisingBatches:
    x, y = images_8x8(dataset, "test")
    return DenoisingBatches(x[:N_TEST], y[:N_TEST], batch_size=256, seed=10_000)


def stats_batches(dataset: str) -> list:
    x, y = images_8x8(dataset, "train", limit=N_STATS)
    return list(DenoisingBatches(x, y, batch_size=128, seed=20_000))


def align(method: str, a, b, stats, learned_steps: int, start=None):
    if method in ("none", "canonical"):
        return None
    if method == "weight-per-tensor":
        return lf.align(a, b, "weight", weighting="per_tensor")
    kw = {} if method in ("permutation", "weight") else {"data": stats}
    if method == "learned":
        # from activation matching: on these DiTs weight matching's start is worse than none
        kw.update(steps=learned_steps, init=start, preset="paper", eval_every=25, patience=8)
    return lf.align(a, b, method, **kw)


def table(dataset: str, pair_seeds: list[int], lambdas: int, learned_steps: int, wait: bool = False) -> dict:
    test, stats = test_batches(dataset), stats_batches(dataset)
    pairs = []
    for i in range(0, len(pair_seeds) - 1, 2):
        a, b = trained(dataset, pair_seeds[i], wait), trained(dataset, pair_seeds[i + 1], wait)
        row, start = {"seeds": [pair_seeds[i], pair_seeds[i + 1]]}, None
        for method in METHODS:
            t0 = time.perf_counter()
            al = align(method, a, b, stats, learned_steps, start)
            seconds = time.perf_counter() - t0
            start = al if method == "activation" else start
            space = "raw" if method in RAW else "canonical"
            res = lf.barrier(a, b if al is None else al.apply(b), test, lambdas=lambdas, space=space)
            row[method] = {"barrier": res.barrier, "loss_mid": res.loss[len(res.loss) // 2], "loss_a": res.loss_a,
                           "loss_b": res.loss_b, "lambdas": res.lambdas, "loss": res.loss, "align_seconds": seconds}
            print(f"{dataset} {row['seeds']} {method:12s} barrier {res.barrier:.4f} "
                  f"(ends {res.loss_a:.4f} {res.loss_b:.4f}, {seconds:.1f} s)", flush=True)
        pairs.append(row)
    summary = {}
    for method in METHODS:
        vals = [p[method]["barrier"] for p in pairs]
        summary[method] = {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals)}
    return {"dataset": dataset, "model": DiTConfig.tiny().to_dict(), "train": TRAIN, "n_test": N_TEST,
            "n_stats": N_STATS, "lambdas": lambdas, "learned_steps": learned_steps, "learned_init": "activation",
            "pairs": pairs,
            "summary": summary, "machine": _machine()}


def objectives(dataset: str, pair_seeds: list[int]) -> dict:
    """Weight matching's objective sum <A, g . B> (canonical space) at the identity, at weight matching's
    element and at activation matching's, in all and on the fixed positions and the modulations alone: whether
    weight matching's poor barriers come from its solver (activation's element scoring higher) or its
    objective (weight's scoring higher and interpolating worse)."""
    from lmc_fast.match import solve
    from lmc_fast.match.pair import params_pair
    from lmc_fast.symmetry.elements import apply_spec

    stats, rows = stats_batches(dataset), []
    for i in range(0, len(pair_seeds) - 1, 2):
        a, b = trained(dataset, pair_seeds[i]), trained(dataset, pair_seeds[i + 1])
        spec, pa, pb = params_pair(a, b, "canonical")
        row = {"seeds": [pair_seeds[i], pair_seeds[i + 1]]}
        for name, al in (("identity", None), ("weight", lf.align(a, b, "weight")),
                         ("activation", lf.align(a, b, "activation", data=stats))):
            moved = pb if al is None else apply_spec(spec, pb, al.elements)
            row[name] = {"objective": solve.objective(pa, moved, list(pa)),
                         "pos_embed": solve.objective(pa, moved, ["pos_embed"]),
                         "modulations": solve.objective(pa, moved, [k for k in pa if ".mod." in k or
                                                                    k.startswith("final.")])}
        print(row, flush=True)
        rows.append(row)
    return {"dataset": dataset, "pairs": rows, "machine": _machine()}


def _machine() -> dict:
    import os
    import platform

    return {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(), "torch": torch.__version__,
            "load_average": os.getloadavg()}


def hybrid(lambdas: int, out_png: Path) -> dict:
    """A digits DiT aligned with a Fashion-MNIST DiT (weight matching, and activation matching on both
    datasets' batches), then pictures sampled from the same noise and classes at each lambda."""
    a, b = trained("digits", 0), trained("fashion", 0)
    mixed_stats = stats_batches("digits")[:4] + stats_batches("fashion")[:4]
    paths = {"raw": (b, "raw"), "weight": (lf.align(a, b, "weight").apply(b), "canonical"),
             "activation": (lf.align(a, b, "activation", data=mixed_stats).apply(b), "canonical")}
    classes = torch.arange(10)
    noise = torch.randn(10, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    lams = [i / (lambdas - 1) for i in range(lambdas)]
    grids, out = {}, {"lambdas": lams, "paths": {}}
    for name, (b2, space) in paths.items():
        rows = []
        for lam in lams:
            m = lf.interpolate([a, b2], [1 - lam, lam], space=space)
            rows.append(sample(m, classes, noise=noise))
        grids[name] = torch.stack(rows)  # (L, 10, 1, 8, 8)
        out["paths"][name] = {  # the path's noise MSE on each dataset's test images
            "digits_loss": lf.barrier(a, b2, test_batches("digits"), lambdas=lams, space=space).loss,
            "fashion_loss": lf.barrier(a, b2, test_batches("fashion"), lambdas=lams, space=space).loss}
    _save_grid(grids, lams, out_png)
    return out


def _save_grid(grids: dict, lams: list[float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(grids)
    n_cls = grids[names[0]].shape[1]
    fig, axes = plt.subplots(len(names) * n_cls // 2, len(lams), figsize=(len(lams) * 0.7, len(names) * n_cls // 2 * 0.7))
    for p, name in enumerate(names):
        for r, cls in enumerate(range(0, n_cls, 2)):
            for j in range(len(lams)):
                ax = axes[p * (n_cls // 2) + r, j]
                ax.imshow(grids[name][j, cls, 0].clamp(-1, 1).numpy(), cmap="gray", vmin=-1, vmax=1)
                ax.set_xticks([]), ax.set_yticks([])
                if j == 0:
                    ax.set_ylabel(f"{name}\nclass {cls}" if r == 0 else f"class {cls}", fontsize=6)
                if p == 0 and r == 0:
                    ax.set_title(f"{lams[j]:.2f}", fontsize=6)
    fig.suptitle("DiT digits (lambda 0) -> DiT Fashion-MNIST (lambda 1): raw / weight / activation aligned", fontsize=7)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=150, bbox_inches="tight")
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("train", "table", "hybrid", "objective"))
    ap.add_argument("--dataset", choices=("digits", "fashion"), default="digits")
    ap.add_argument("--seeds", default="0-9")
    ap.add_argument("--lambdas", type=int, default=11)
    ap.add_argument("--learned-steps", type=int, default=300)
    ap.add_argument("--wait", action="store_true", help="table: wait for models another `train` process writes")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    if args.what == "train":
        for s in seeds(args.seeds):
            trained(args.dataset, s)
    elif args.what == "table":
        out = table(args.dataset, seeds(args.seeds), args.lambdas, args.learned_steps, args.wait)
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / f"dit_barriers_{args.dataset}.json").write_text(json.dumps(out, indent=1))
        for m, s in out["summary"].items():
            print(f"{m:12s} median {s['median']:.4f} [{s['min']:.4f}, {s['max']:.4f}]")
    elif args.what == "objective":
        out = objectives(args.dataset, seeds(args.seeds))
        (RESULTS / f"dit_objective_{args.dataset}.json").write_text(json.dumps(out, indent=1))
    else:
        out = hybrid(args.lambdas, ROOT / "docs" / "dit_hybrid.png")
        (RESULTS / "dit_hybrid.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
