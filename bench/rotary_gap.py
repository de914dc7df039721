"""Why the tiny LLaMAs keep a barrier the tiny GPT-NeoXs lose: one architectural difference at a time.

Table 1's two rotary language models share data, size (4 x 128), schedule and seeds; weight matching
leaves 0.435 on the LLaMAs and 0.185 on the NeoXs, the default learned matching 0.082 and 0.024 at
2000 steps. This study trains variants of the two recipes (lmc_fast/recipes.py; config fields
overridden, nothing else), seeds 0-5, three disjoint pairs each:

  neox                  the recipe: LayerNorm with biases, rotary on a quarter of each head, parallel blocks
  llama                 the recipe: RMSNorm, full rotary, 2 key/value heads for 4, SwiGLU, no biases
  llama-mha             4 key/value heads (no grouped-query attention)
  llama-qkv-bias        biases on q, k, v (Qwen2-style)
  neox-rotary           NeoX with rotary positions on every head dim (the recipe: a quarter)
  neox-rotary-seq       the same with sequential blocks (the recipe: parallel attention and MLP)

and five that no config field gives, each changing one of the last differences between `llama` and
`neox-rotary-seq` (the norm, the MLP) on one side: the model is the recipe's class with the norm and
MLP modules the changed architecture asks for (`ArchVariant`), stored as safetensors with its variant
name, so lmc_fast.io would not load it as the recipe's model:

  llama-layernorm       LayerNorm with biases instead of RMSNorm
  llama-gelu            a plain GELU MLP of width 512 (4 x 128, the SwiGLU's parameters) instead of SwiGLU of width 344
  llama-gelu-narrow     the same GELU MLP at the SwiGLU's width, 344 (its units, two thirds of its parameters)
  neox-swiglu           neox-rotary-seq with a SwiGLU MLP of width 344 (biases kept)
  neox-rmsnorm          neox-rotary-seq with RMSNorm instead of LayerNorm

Per pair: the barrier after weight matching, and where it sits. "A + part at the midpoint": the
loss of model A with one part's parameters replaced by the aligned midpoint's (canonical space,
the rest A's) minus A's loss: a part whose two aligned versions compute different things costs a lot
alone. Parts: the embedding, each block's attention split into its QK pair (q, k) and VO pair
(v, o), each MLP, the final norm and head. On `llama` also weight matching followed by matching the
SwiGLU units' signs (up row and down column negated together: exact, not in the library's group,
see docs/ARCHITECTURE.md section 1.5): a post-pass that re-solves each MLP's assignment with
|<up, up'> + <down, down'>| and bakes the chosen signs into B, then weight matching again, 4 rounds.
`--learned-steps N` adds the library's default learned matching (labels-loop) at N steps on the
first `--learned-pairs` pairs of each variant (expensive: ~7 min a pair at 600 steps on one core, load 2).

Evaluation as Table 1's grids: 11 lambdas over the first 512 test blocks of 64 bytes in batches of 128.

    OMP_NUM_THREADS=1 LMC_FAST_DATA=data_cache python bench/rotary_gap.py train --models DIR
    OMP_NUM_THREADS=1 LMC_FAST_DATA=data_cache python bench/rotary_gap.py measure --models DIR
Writes bench/results/rotary_gap.{json,md}.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from scipy.optimize import linear_sum_assignment
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import cpu_model  # noqa: E402

import lmc_fast as lf  # noqa: E402
from lmc_fast.data import loader  # noqa: E402
from lmc_fast.io import load_model, save_model  # noqa: E402
from lmc_fast.recipes import recipe  # noqa: E402
from lmc_fast.sweep.evaluate import EvalOptions, evaluate_mixtures  # noqa: E402
from lmc_fast.sweep.interpolate import space_params  # noqa: E402
from lmc_fast.train import train  # noqa: E402
from lmc_fast.train import seed_everything  # noqa: E402
from lmc_fast.models.functional_lm import FunctionalLanguageModel  # noqa: E402
from lmc_fast.models.llama import LlamaAttention, swiglu_width  # noqa: E402
from lmc_fast.models.neox import NeoX, NeoXAttention  # noqa: E402

NEOX_SEQ = {"rotary_pct": 1.0, "parallel_residual": False}
GELU_MLP = {"mlp": "plain", "activation": "gelu"}
SWIGLU_MLP = {"mlp": "gated", "activation": "silu"}
# name -> (recipe, config overrides, Arch overrides: the norm / MLP no config field of the recipe's class sets)
VARIANTS = {
    "neox": ("neox-shakespeare", {}, {}),
    "llama": ("llama-shakespeare", {}, {}),
    "llama-mha": ("llama-shakespeare", {"n_kv_head": 4}, {}),
    "llama-qkv-bias": ("llama-shakespeare", {"qkv_bias": True}, {}),
    "neox-rotary": ("neox-shakespeare", {"rotary_pct": 1.0}, {}),
    "neox-rotary-seq": ("neox-shakespeare", NEOX_SEQ, {}),
    "llama-layernorm": ("llama-shakespeare", {}, {"norm": "layernorm"}),
    "llama-gelu": ("llama-shakespeare", {"d_mlp": 512}, GELU_MLP),  # the SwiGLU's parameter count
    "llama-gelu-narrow": ("llama-shakespeare", {"d_mlp": swiglu_width(128)}, GELU_MLP),  # its unit count
    "neox-swiglu": ("neox-shakespeare", {**NEOX_SEQ, "d_mlp": swiglu_width(128)}, SWIGLU_MLP),
    "neox-rmsnorm": ("neox-shakespeare", NEOX_SEQ, {"norm": "rmsnorm"}),
}
SEEDS = range(6)
PAIRS = ((0, 1), (2, 3), (4, 5))
SIGN_ROUNDS = 4
WEIGHTS = "variant.safetensors"


class VariantMLP(nn.Module):
    """An MLP's parameters as `arch` has them: fc1 / fc2, and gate when gated; biases when mlp_bias."""

    def __init__(self, arch):
        super().__init__()
        d, f, bias = arch.d_model, arch.d_mlp, bool(arch.mlp_bias)
        if arch.gated:
            self.gate = nn.Linear(d, f, bias=bias)
        self.fc1, self.fc2 = nn.Linear(d, f, bias=bias), nn.Linear(f, d, bias=bias)


@functools.cache  # one class per variant, so two models of a variant have one type
def variant_class(name: str):
    """The recipe's class (Llama or NeoX) with the architecture changed by the variant's Arch overrides:
    the same attention modules, the norms and MLP that the changed Arch names. A subclass built from
    its config alone, so the library's reference adapter (which reads `arch()` and rebuilds a model as
    `type(model)(config)`) serves it; its forward is the functional one of that Arch."""
    base = type(recipe(VARIANTS[name][0]).model())
    arch_overrides = dict(VARIANTS[name][2])

    class ArchVariant(base):
        def __init__(self, config):
            FunctionalLanguageModel.__init__(self)
            self.config, self.arch_overrides = config, arch_overrides
            arch = self.arch()
            attn = NeoXAttention if base is NeoX else LlamaAttention
            self._decoder(config, arch.norm, lambda: attn(config), lambda: VariantMLP(arch))

        def arch(self):
            return dataclasses.replace(base.arch(self), **self.arch_overrides)

    ArchVariant.__name__ = ArchVariant.__qualname__ = f"{base.__name__}Variant"
    return ArchVariant


def variant_recipe(name: str):
    base, overrides, _ = VARIANTS[name]
    r = recipe(base)
    return dataclasses.replace(r, model_config=dataclasses.replace(r.model_config, **overrides))


def variant_model(name: str, seed: int):
    """A freshly initialised model of the variant, seeded as the recipe seeds its own."""
    r = variant_recipe(name)
    model = r.model(seed=seed)
    arch_overrides = VARIANTS[name][2]
    if not arch_overrides:
        return model
    seed_everything(seed)
    return variant_class(name)(model.config)


def save_variant(model, out: Path, metadata: dict) -> None:
    if not getattr(model, "arch_overrides", None):
        save_model(model, out, metadata=metadata)
        return
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / (WEIGHTS + ".tmp")
    save_file({k: v.detach().contiguous() for k, v in model.state_dict().items()}, str(tmp),
              metadata={"variant": json.dumps(metadata)})
    tmp.replace(out / WEIGHTS)


def load_variant(models: Path, name: str, seed: int):
    folder = models / name / f"seed{seed}"
    if not VARIANTS[name][2]:
        return load_model(folder)
    model = variant_model(name, seed)
    model.load_state_dict(load_file(str(folder / WEIGHTS)))  # strict: every parameter, no other
    return model.eval()


def is_trained(models: Path, name: str, seed: int) -> bool:
    folder = models / name / f"seed{seed}"
    return (folder / (WEIGHTS if VARIANTS[name][2] else "config.json")).exists()


def train_variants(models: Path, names) -> None:
    for name in names:
        r = variant_recipe(name)
        for seed in SEEDS:
            if is_trained(models, name, seed):
                continue
            t0 = time.perf_counter()
            model = variant_model(name, seed)
            train(model, **r.train_kwargs, seed=seed)
            save_variant(model, models / name / f"seed{seed}",
                         {"recipe": VARIANTS[name][0], "overrides": VARIANTS[name][1],
                          "arch_overrides": VARIANTS[name][2], "seed": seed, "seconds": time.perf_counter() - t0})
            print(f"{name} seed {seed}: {time.perf_counter() - t0:.0f} s", flush=True)


def part_of(name: str) -> str:
    """The part a standard parameter belongs to: embed, attn<l>.qk, attn<l>.vo, mlp<l>, head."""
    m = re.match(r"blocks\.(\d+)\.(attn|mlp)\.(\w+)\.", name)
    if m:
        layer, kind, sub = m.groups()
        if kind == "mlp":
            return f"mlp{layer}"
        return f"attn{layer}.{'qk' if sub in ('q', 'k') else 'vo'}"
    if name.startswith("blocks."):
        return "norms"  # folded into their readers by the canonical form: identity after it
    return "embed" if "embed" in name else "head"


def part_costs(a, b_aligned, test) -> dict:
    """Loss of A with one part at the aligned midpoint, minus A's loss; and the midpoint's barrier."""
    arch, pa = space_params(a, "canonical")
    _, pb = space_params(b_aligned, "canonical")
    mid = {k: 0.5 * (pa[k] + pb[k]) for k in pa}
    parts = sorted({part_of(k) for k in pa} - {"norms"})
    params = [pa, pb, mid] + [{k: (mid[k] if part_of(k) == p else pa[k]) for k in pa} for p in parts]
    out = evaluate_mixtures(arch, params, torch.eye(len(params), dtype=torch.float64), test, EvalOptions())
    loss = [o["loss"] for o in out]
    return {p: loss[3 + i] - loss[0] for i, p in enumerate(parts)}


def signed_units(a, b):
    """Weight matching, then each SwiGLU MLP's units re-assigned with signs (|<up,up'> + <down,down'>|
    beside <gate,gate'>), the signs baked into B (exact), SIGN_ROUNDS times. Returns (B', units flipped)."""
    _, pa = space_params(a, "canonical")
    current, flipped = b, []
    for _ in range(SIGN_ROUNDS):
        current = lf.align(a, current, "weight").apply(current)
        _, pb = space_params(current, "canonical")
        n = 0
        with torch.no_grad():
            for layer, block in enumerate(current.blocks):
                p = f"blocks.{layer}.mlp."
                gate = pa[p + "gate.weight"] @ pb[p + "gate.weight"].T
                signed = pa[p + "fc1.weight"] @ pb[p + "fc1.weight"].T + pa[p + "fc2.weight"].T @ pb[p + "fc2.weight"]
                rows, cols = linear_sum_assignment((gate + signed.abs()).numpy(), maximize=True)
                sign = torch.sign(signed[rows, cols]).float()
                cols = torch.as_tensor(cols)
                mlp = block.mlp
                mlp.gate.weight.copy_(mlp.gate.weight[cols])
                mlp.fc1.weight.copy_(mlp.fc1.weight[cols] * sign[:, None])
                mlp.fc2.weight.copy_(mlp.fc2.weight[:, cols] * sign[None])
                n += int((sign < 0).sum())
        flipped.append(n)
    return lf.align(a, current, "weight").apply(current), flipped


def pair_record(models: Path, name: str, seeds, test, train_batches, learned_steps: int) -> dict:
    a, b = (load_variant(models, name, s) for s in seeds)
    t0 = time.perf_counter()
    b_weight = lf.align(a, b, "weight").apply(b)
    rec = {"seeds": list(seeds), "weight_seconds": time.perf_counter() - t0,
           "none": lf.barrier(a, b, test, lambdas=11, space="raw").barrier,
           "weight": lf.barrier(a, b_weight, test, lambdas=11).barrier,
           "parts": part_costs(a, b_weight, test)}
    if a.arch().gated and not a.arch().mlp_bias:  # the sign pass moves weights only
        b_signed, flipped = signed_units(a, b)
        rec["weight_signed_units"] = lf.barrier(a, b_signed, test, lambdas=11).barrier
        rec["units_flipped_per_round"] = flipped
    if learned_steps:
        t0 = time.perf_counter()
        al = lf.align(a, b, "learned", data=train_batches, preset="labels-loop", steps=learned_steps)
        rec["learned"] = lf.barrier(a, al.apply(b), test, lambdas=11).barrier
        rec["learned_seconds"] = time.perf_counter() - t0
    return rec


def stats(values) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def summarise(records: dict) -> dict:
    out = {}
    for name, recs in records.items():
        s = {k: stats([r[k] for r in recs if k in r]) for k in ("none", "weight", "weight_signed_units", "learned")
             if any(k in r for r in recs)}
        s["parts"] = {p: stats([r["parts"][p] for r in recs]) for p in recs[0]["parts"]}
        out[name] = s
    return out


def cell(s: dict | None) -> str:
    return "" if not s else f"{s['median']:.3f} [{s['min']:.3f}, {s['max']:.3f}]" + (
        f" ({s['n']} pair{'s' if s['n'] > 1 else ''})" if s["n"] != len(PAIRS) else "")


def table(summary: dict) -> str:
    lines = ["Weight matching by architecture variant, loss barrier median [min, max] over 3 pairs (seeds 0-5):", "",
             "| variant | none | weight | weight + SwiGLU signs | learned (labels-loop) |", "|---|---:|---:|---:|---:|"]
    for name, s in summary.items():
        lines.append(f"| {name} | {cell(s.get('none'))} | {cell(s.get('weight'))} | "
                     f"{cell(s.get('weight_signed_units'))} | {cell(s.get('learned'))} |")
    parts = sorted({p for s in summary.values() for p in s["parts"]},
                   key=lambda p: (p not in ("embed",), p == "head", p))
    lines += ["", "Where weight matching's barrier sits: loss of A with one part at the aligned midpoint, minus A's "
              "(median over the pairs):", "",
              "| variant | " + " | ".join(parts) + " |", "|---|" + "---:|" * len(parts)]
    for name, s in summary.items():
        lines.append(f"| {name} | " + " | ".join(
            f"{s['parts'][p]['median']:+.3f}" if p in s["parts"] else "" for p in parts) + " |")
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("command", choices=("train", "measure", "combine"))
    p.add_argument("--models", help="folder of <variant>/seed<N> model folders (train, measure)")
    p.add_argument("--inputs", nargs="+", default=[], help="combine: measure outputs (.json) of disjoint variants")
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--learned-steps", type=int, default=0)
    p.add_argument("--learned-pairs", type=int, default=1)
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "rotary_gap"))
    args = p.parse_args()
    torch.set_num_threads(1)
    if args.command == "combine":
        write(combine([json.loads(Path(f).read_text()) for f in args.inputs]), Path(args.out))
        return
    if not args.models:
        p.error(f"{args.command} needs --models")
    models = Path(args.models)
    if args.command == "train":
        train_variants(models, args.variants)
        return
    train_ds, test_ds = recipe("llama-shakespeare").datasets()
    test = list(loader(test_ds.subset(range(512)), 128))
    train_batches = []  # Table 1's matching data: the first 60 shuffled training batches of 128 (seed 0)
    for batch in loader(train_ds, 128, shuffle=True, seed=0):
        if len(train_batches) == 60:
            break
        train_batches.append(batch)
    records = {}
    for name in args.variants:
        records[name] = []
        for i, seeds in enumerate(PAIRS):
            steps = args.learned_steps if i < args.learned_pairs else 0
            r = pair_record(models, name, seeds, test, train_batches, steps)
            records[name].append(r)
            print(name, seeds, " ".join(f"{k}={r[k]:.4f}" for k in ("none", "weight", "weight_signed_units", "learned")
                                        if k in r), flush=True)
    summary = summarise(records)
    result = {"kind": "rotary_gap", "machine": cpu_model(), "torch": torch.__version__, "torch_threads": 1,
              "load_average": os.getloadavg(), "variants": {n: VARIANTS[n] for n in args.variants},
              "pairs": [list(s) for s in PAIRS], "test_blocks": 512, "lambdas": 11,
              "learned": {"preset": "labels-loop", "steps": args.learned_steps, "pairs": args.learned_pairs,
                          "batches": [60, 128]},
              "summary": summary, "records": records}
    write(result, Path(args.out))


def combine(results: list) -> dict:
    """One result of measure runs over disjoint variants (e.g. one per core), each run's machine and load kept."""
    if not results:
        raise SystemExit("combine: give --inputs")
    names = [n for r in results for n in r["records"]]
    if len(set(names)) != len(names):
        raise SystemExit(f"combine: a variant is in more than one input: {sorted(names)}")
    keep = ("pairs", "test_blocks", "lambdas")
    if any(r.get(k) != results[0].get(k) for r in results for k in keep):
        raise SystemExit(f"combine: the inputs differ in {keep}")
    records = {n: recs for r in results for n, recs in r["records"].items()}
    runs = [{k: r[k] for k in ("machine", "torch", "torch_threads", "load_average", "variants", "learned")}
            for r in results]
    return {"kind": "rotary_gap", **{k: results[0][k] for k in keep}, "runs": runs,
            "summary": summarise(records), "records": records}


def write(result: dict, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    out.with_suffix(".md").write_text(table(result["summary"]))
    print(table(result["summary"]))
    print(f"-> {out}.json, {out}.md")


if __name__ == "__main__":
    main()
