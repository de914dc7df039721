"""Learned matching's step on the CPU, before and after its projection was made cheaper, in one process.

Before: the orthogonal maps' gradient through ten Newton-Schulz iterations (about sixty n x n products per
map, forward and backward) and each hard permutation matrix applied as an n x n product. After (the
library now): the polar factor's exact gradient from one eigendecomposition and six products
(match/kinds/base.py, `_ExactPolar`) and the permutations applied as gathers with the same gradients
(symmetry/groups.py, `_OneHotRows`). The before arm is the library with those two pieces swapped back
(`previous_projection`). Each arm runs the loop's own step (mixture forward, task loss, backward, clipping,
AdamW) on the same random-initialised pair of each recipe (a step's cost does not depend on what the
weights are) and the same batch, interleaved. Also recorded: how far apart the two arms' first gradients
are (rounding: Newton-Schulz converges on these latents) and the FLOPs of one polar gradient each way.

    OMP_NUM_THREADS=1 LMC_FAST_DATA=data_cache python bench/bench_learned_projection.py [--steps 20] [--repeat 3]

`--align-models DIR --align-data SPEC` times whole `lf.align(a, b, "learned", ...)` runs instead, through the
public API (weight matching's start, the steps, the validation barriers), on a trained pair (DIR/seed0, seed1).
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import print_table, record, write_results  # noqa: E402

from lmc_fast import kernels  # noqa: E402
from lmc_fast.data import loader  # noqa: E402
from lmc_fast.match.kinds import base, heads, orthogonal  # noqa: E402
from lmc_fast.match.learned_module import LearnedAlignment  # noqa: E402
from lmc_fast.recipes import recipe  # noqa: E402
from lmc_fast.sweep.metrics import task_loss, task_of  # noqa: E402
from lmc_fast.symmetry import groups  # noqa: E402

RECIPES = ("vit-fashion-mnist", "gpt2-shakespeare", "llama-shakespeare", "neox-shakespeare", "bert-shakespeare")


def _polar_ste_newton_schulz(M):
    exact = kernels.polar(M.detach())
    return exact.to(M.dtype) + base.polar_ste_newton_schulz(M, exact)


def _dense_product(self, flat, g, ax, dense):
    return dense["P"] @ flat


@contextlib.contextmanager
def previous_projection():
    """The library's projection as it was: Newton-Schulz gradients for the maps, permutation products."""
    saved = (heads.polar_ste, orthogonal.polar_ste, groups.Permutation.apply_dense)
    heads.polar_ste = orthogonal.polar_ste = _polar_ste_newton_schulz
    groups.Permutation.apply_dense = _dense_product
    try:
        yield
    finally:
        heads.polar_ste, orthogonal.polar_ste, groups.Permutation.apply_dense = saved


def make_step(la, x, y):
    params = [p for p in la.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-2, weight_decay=0.01)
    gen = torch.Generator().manual_seed(0)
    task = task_of(la.arch)

    def step():
        lam = torch.rand(1, generator=gen).item()
        logits = la.mixture_logits(x, torch.tensor([[1 - lam, lam]]))
        loss = task_loss(logits[0], y, task=task)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()

    return step


def seconds_per_step(la, x, y, steps: int) -> float:
    step = make_step(la, x, y)
    step()  # warm-up (the assignment's warm start)
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - t0) / steps


def first_gradients(la, x, y) -> list:
    la.zero_grad(set_to_none=True)
    logits = la.mixture_logits(x, torch.tensor([[0.5, 0.5]]))
    task_loss(logits[0], y, task=task_of(la.arch)).backward()
    return [p.grad.clone() for p in la.parameters() if p.requires_grad]


def polar_gradient_flops(n: int) -> dict:
    """Multiply-adds x 2 of one n x n map's gradient: Newton-Schulz (10 iterations of two products forward,
    four backward) against the exact form (six products and an eigendecomposition, about 9 n^3 [Golub-Van
    Loan, tridiagonal QR with vectors])."""
    product = 2 * n ** 3
    return {"newton_schulz": 10 * 6 * product, "exact": 6 * product + 9 * n ** 3}


def align_seconds(models: str, data_spec: str, batch: int, batches: int, steps: int, repeat: int) -> list:
    """Whole learned-matching runs through `lf.align`, before and after, interleaved: one record."""
    import lmc_fast as lf
    from lmc_fast.data_specs import load_data
    from lmc_fast.io import load_model

    a, b = (load_model(Path(models) / s).float().eval() for s in ("seed0", "seed1"))
    data = []
    for x, y in loader(load_data(data_spec)[0], batch, shuffle=True, seed=0):
        data.append((x, y))
        if len(data) == batches:
            break

    def run():
        t0 = time.perf_counter()
        lf.align(a, b, "learned", data=data, preset="labels-loop", steps=steps)
        return time.perf_counter() - t0

    before, after = [], []
    for _ in range(repeat):
        with previous_projection():
            before.append(run())
        after.append(run())
    return [record("learned_align", device="cpu", dtype="float32",
                   sizes={"models": str(models), "data": data_spec, "batch": batch, "batches": batches, "steps": steps,
                          "repeat": repeat, "preset": "labels-loop"},
                   baseline="Newton-Schulz polar gradients, permutation matrices applied as products",
                   baseline_s=statistics.median(before), ours_s=statistics.median(after),
                   extra={"baseline_s_all": before, "ours_s_all": after})]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipes", nargs="+", default=list(RECIPES))
    ap.add_argument("--batches", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--align-models", default=None, help="a folder with seed0 and seed1: time lf.align runs instead")
    ap.add_argument("--align-data", default="shakespeare", help="their data spec")
    ap.add_argument("--name", default="learned_projection", help="the results file's stem")
    ap.add_argument("--out", default=None, help="directory for the JSON (default bench/results/)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    if args.align_models:
        for seed in ("seed0", "seed1"):
            if not (Path(args.align_models) / seed).is_dir():
                raise SystemExit(f"{args.align_models}: no {seed} folder (a grid's models/ holds seed0, seed1, ...)")
        records = align_seconds(args.align_models, args.align_data, args.batches[0], 3840 // args.batches[0],
                                args.steps, args.repeat)
        path = write_results(args.name, records, out=args.out)
        print_table(records)
        print(f"-> {path}")
        return
    records = []
    for name in args.recipes:
        r = recipe(name)
        a, b = r.model(0), r.model(1)
        for batch in args.batches:
            # fresh latents for each batch size: the first gradients compare the two arms at one point
            before_la, after_la = LearnedAlignment(a, b, "identity"), LearnedAlignment(a, b, "identity")
            rotations = [blk.rotation.shape[-1] for blk in after_la.latents[0].blocks.values() if hasattr(blk, "rotation")]
            x, y = next(iter(loader(r.datasets()[0], batch, shuffle=True, seed=0)))
            with previous_projection():
                g_before = first_gradients(before_la, x, y)
            g_after = first_gradients(after_la, x, y)
            diff = max(float((u - v).norm() / v.norm().clamp_min(1e-30)) for u, v in zip(g_before, g_after))
            before, after = [], []
            for _ in range(args.repeat):  # interleaved, so drift hits both alike
                with previous_projection():
                    before.append(seconds_per_step(before_la, x, y, args.steps))
                after.append(seconds_per_step(after_la, x, y, args.steps))
            rec = record("learned_step", device="cpu", dtype="float32",
                         sizes={"recipe": name, "batch": batch, "steps": args.steps, "repeat": args.repeat,
                                "lambdas_per_step": 1, "residual_rotation_n": rotations[0] if rotations else None},
                         baseline="Newton-Schulz polar gradients, permutation matrices applied as products",
                         baseline_s=statistics.median(before), ours_s=statistics.median(after),
                         extra={"baseline_s_all": before, "ours_s_all": after,
                                "first_gradient_max_rel_diff": diff,
                                "residual_polar_gradient_flops": polar_gradient_flops(rotations[0]) if rotations else None})
            records.append(rec)
            print(f"{name} batch {batch}: {1 / rec['baseline_s']:.2f} -> {1 / rec['ours_s']:.2f} steps/s "
                  f"({rec['speedup']:.2f}x), first gradients within {diff:.1e}", flush=True)
    path = write_results(args.name, records, out=args.out)
    print_table(records)
    print(f"-> {path}")


if __name__ == "__main__":
    main()
