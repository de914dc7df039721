"""Does learned matching gain from searching SwiGLU's unit scales instead of fixing them by the canonical form?

The canonical form balances each gated unit (up row and down column of equal norms, symmetry/canonical.py),
which removes the scale from the function but not from the path: the mixture (1 - lam) u_A + lam s u_B,
(1 - lam) d_A + lam d_B / s depends on s. This study adds one latent per unit of B, log s, to learned matching
(the library's loop, `fit_alignments`, unchanged) and compares it with the same run without it, pair by pair.

- "none": the default preset (labels-loop) as the grid runs it, from the token-prior weight-matching start.
- "scale": the same, with B's up rows scaled by s = exp(factor * z) and its down columns by 1 / s before the
  group acts, z trained with the other latents (AdamW at the same rate). The scales' gradient is shrunk by
  1e-4 before the clip (Adam ignores a gradient's scale; the clip's norm would not), so the other latents
  take the same clipped steps as in "none". factor 0 gives "none" exactly (a check this script makes possible).

Barrier: test loss, 11 lambdas, the grid spec's eval batches, in canonical space with B's learned scales.

    python bench/learned_swiglu_scales.py --spec bench/results/learned_budget_loop/llama_loop_batch_1800/spec.toml \\
        --models /tmp/lmc_grids/llama_loop_batch_1800/models --pair 0 --mode scale --out X.jsonl
appends one JSON record per run to X.jsonl; `table X.jsonl --out Y` writes the per-pair comparison.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import cpu_model  # noqa: E402

from lmc_fast.grid.runner import _batches, _data, with_block_size  # noqa: E402
from lmc_fast.grid.spec import load_spec  # noqa: E402
from lmc_fast.io import load_model  # noqa: E402
from lmc_fast.match import learned as L  # noqa: E402
from lmc_fast.match.learned_module import LearnedAlignment  # noqa: E402
from lmc_fast.match.weight import align_by_weights  # noqa: E402
from lmc_fast.sweep.evaluate import EvalOptions, evaluate_mixtures  # noqa: E402
from lmc_fast.sweep.result import barrier_result  # noqa: E402
from lmc_fast.symmetry import Alignment  # noqa: E402

LAMBDAS = [i / 10 for i in range(11)]
#: the scales' gradient is multiplied by this before the clip (Adam's step does not depend on it)
OUT_OF_CLIP = 1e-4


def scaled_units(params: dict, n_layer: int, s) -> dict:
    """B's parameters with unit i of each gated MLP's up row (and bias) times s[l, i], its down column over it."""
    p = dict(params)
    for layer in range(n_layer):
        pre = f"blocks.{layer}.mlp."
        p[pre + "fc1.weight"] = p[pre + "fc1.weight"] * s[layer][:, None]
        if pre + "fc1.bias" in p:
            p[pre + "fc1.bias"] = p[pre + "fc1.bias"] * s[layer]
        p[pre + "fc2.weight"] = p[pre + "fc2.weight"] / s[layer][None, :]
    return p


class ScaledAlignment(LearnedAlignment):
    """LearnedAlignment with one trained log-scale per SwiGLU unit of B (factor 0: no scale moves)."""

    def __init__(self, model_a, model_b, init, factor: float):
        super().__init__(model_a, model_b, init)
        if not self.arch.gated:
            raise SystemExit("learned_swiglu_scales: the models' MLP is not gated (SwiGLU)")
        self.factor = factor
        n = self.params_list[1]["blocks.0.mlp.fc1.weight"].shape[0]
        self.log_scale = torch.nn.Parameter(torch.zeros(self.arch.n_layer, n))
        self.log_scale.register_hook(lambda g: g * OUT_OF_CLIP)
        self.original_b = dict(self.params_list[1])
        self.scales_of = {}  # id(hard elements) -> the float64 B they were projected with

    def fixed_params(self):
        fixed = super().fixed_params()
        fixed[1] = scaled_units(fixed[1], self.arch.n_layer, (self.factor * self.log_scale).exp())
        return fixed

    def hard_elements(self):
        # the loop's validation applies the hard elements to params_list[1]: B with the current scales
        s = (self.factor * self.log_scale.detach().double()).exp()
        self.params_list[1] = scaled_units(self.original_b, self.arch.n_layer, s)
        hard = super().hard_elements()
        self.scales_of[id(hard)] = (s, self.params_list[1])
        return hard


def run(args) -> dict:
    torch.set_num_threads(1)
    spec = with_block_size(load_spec(args.spec))
    i, j = spec.pairs[args.pair]
    a, b = (load_model(str(Path(args.models) / f"seed{spec.seeds[k]}")).eval() for k in (i, j))
    train_ds, test_ds = _data(spec)
    match = _batches(train_ds, spec.match_batch_size, True, spec.match_max_batches, "cpu")
    test = _batches(test_ds, spec.batch_size, False, spec.max_batches, "cpu")
    method = spec.methods[0]
    given = {k: v for k, v in spec.options[method].items() if k not in ("preset", "method")}
    if args.steps is not None:  # a shorter run (a smoke test), validation as often as the spec's tenth
        given.update(steps=args.steps, eval_every=max(args.steps // 10, 1))
    o = L.preset_settings(spec.options[method].get("preset", "labels-loop"), **given)
    train, val = L.split_batches(match, o["val_fraction"])
    start = align_by_weights(a, b, seed=0, token_counts=train)
    factor = 0.0 if args.mode == "none" else args.factor
    module = ScaledAlignment(a, b, start, factor)
    t0 = time.perf_counter()
    hard, info = L.fit_alignments(module, train, val, steps=o["steps"], lr=o["lr"], lam=o["lam"],
                                  lambdas_per_step=o["lambdas_per_step"], eval_every=o["eval_every"],
                                  patience=o["patience"], seed=0, target=o["target"],
                                  weight_decay=o["weight_decay"], warmup=o["warmup"], clip=o["clip"])
    seconds = time.perf_counter() - t0
    s, pb = module.scales_of[id(hard)]
    aligned_b = Alignment(module.spec, hard[0]).apply_params(pb)
    rows = evaluate_mixtures(module.arch, [module.params_list[0], aligned_b], [[1 - x, x] for x in LAMBDAS], test,
                             EvalOptions())
    result = barrier_result(LAMBDAS, dict(zip(LAMBDAS, rows)), "canonical", "batched", 0.0)
    barrier, loss = result.barrier, result.loss
    log_s = s.log()
    return {"spec": args.spec, "pair": [i, j], "mode": args.mode, "factor": factor, "steps": info["steps"],
            "best_step": info["best_step"], "val_barrier": info["val_barrier"], "barrier": barrier, "curve": loss,
            "seconds": seconds, "log_scale_abs_mean": float(log_s.abs().mean()),
            "log_scale_abs_max": float(log_s.abs().max()), "machine": cpu_model(), "load_average": os.getloadavg(),
            "torch": torch.__version__, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def table(paths, out: Path, note: str = "") -> None:
    recs = [json.loads(line) for p in paths for line in open(p) if line.strip()]
    by = {}
    for r in recs:
        by.setdefault((tuple(r["pair"]), r["mode"], r["factor"]), r)
    pairs = sorted({k[0] for k in by})
    modes = sorted({(k[1], k[2]) for k in by})
    lines = ["Learned matching with SwiGLU unit scales searched (\"scale\") or fixed by the canonical form (\"none\"): "
             "test loss barrier per pair", "", "| mode | factor | " + " | ".join(f"{p}" for p in pairs)
             + " | median [min, max] | mean abs log s (median over pairs) |", "|---|---:|" + "---:|" * (len(pairs) + 2)]
    summary = {}
    for mode, factor in modes:
        vals = [by[(p, mode, factor)]["barrier"] if (p, mode, factor) in by else None for p in pairs]
        got = [v for v in vals if v is not None]
        moved = [by[(p, mode, factor)]["log_scale_abs_mean"] for p in pairs if (p, mode, factor) in by]
        summary[f"{mode}@{factor}"] = {"pairs": [list(p) for p, v in zip(pairs, vals) if v is not None],
                                      "barriers": got, "median": statistics.median(got), "min": min(got),
                                      "max": max(got)}
        lines.append(f"| {mode} | {factor:g} | " + " | ".join("" if v is None else f"{v:.4f}" for v in vals)
                     + f" | {statistics.median(got):.4f} [{min(got):.4f}, {max(got):.4f}] | "
                     + f"{statistics.median(moved):.4f} |")
    if note:
        lines += ["", note]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(json.dumps({"kind": "learned_swiglu_scales", "note": note, "summary": summary,
                                                    "records": recs}, indent=1) + "\n")
    print("\n".join(lines))


def main(argv=None) -> None:
    if argv is None:
        argv = sys.argv[1:]
    if argv and argv[0] == "table":
        p = argparse.ArgumentParser(prog="learned_swiglu_scales.py table")
        p.add_argument("inputs", nargs="+")
        p.add_argument("--out", required=True, type=Path)
        p.add_argument("--note", default="", help="where and when the runs ran (the records' machine fields)")
        a = p.parse_args(argv[1:])
        table(a.inputs, a.out, a.note)
        return
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--spec", required=True)
    p.add_argument("--models", required=True)
    p.add_argument("--pair", type=int, required=True, help="index into the spec's pairs")
    p.add_argument("--mode", choices=("none", "scale"), required=True)
    p.add_argument("--factor", type=float, default=1.0, help="log s = factor * latent (0: scales fixed)")
    p.add_argument("--steps", type=int, default=None, help="override the spec method's steps")
    p.add_argument("--out", required=True, type=Path)
    a = p.parse_args(argv)
    rec = run(a)
    with open(a.out, "a", encoding="utf-8") as f:
        f.write(json.dumps(rec) + "\n")
    print(json.dumps({k: v for k, v in rec.items() if k != "curve"}))


if __name__ == "__main__":
    main()
