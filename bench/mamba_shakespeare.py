"""Tiny Hugging Face Mambas on byte-level Shakespeare, one per seed, for Table 1's Mamba row.

    OMP_NUM_THREADS=1 LMC_FAST_DATA=data_cache python bench/mamba_shakespeare.py --out data_cache/mamba

Hugging Face's MambaForCausalLM has no fast CPU path (its sequential torch scan: one AdamW step of a 4 x 128
model on a (64, 64) batch took 31 s), so the models are trained through the library's functional forward
instead (`models/functional.py`, the same function: tests/test_mamba.py checks it against HF's logits):
HF's own seeded initialisation, its standard parameters made leaves, the llama-shakespeare recipe's
optimiser, schedule, batch, block size and data (lmc_fast/recipes.py, lmc_fast/train.py), then
`adapter.build` turns them back into a MambaForCausalLM saved with `lmc_fast.io.save_model` (a
save_pretrained folder and its metadata). A seed whose folder already holds these settings is skipped.
"""
from __future__ import annotations

import argparse
import json
import math
import time
import warnings
from pathlib import Path

import torch

from lmc_fast.data import load_shakespeare
from lmc_fast.data.loader import Loader
from lmc_fast.io import load_model, save_model
from lmc_fast.models import functional as Fn
from lmc_fast.models.adapters import adapter_for, standard_params
from lmc_fast.sweep.metrics import task_loss
from lmc_fast.train import lr_at, seed_everything

# d_inner = expand * hidden = 192, 0.16M parameters; sized so 10 models train in ~20 min on one core
# (0.29-0.35 s a step measured; bench/results/table1/mamba/models.json)
CONFIG = dict(vocab_size=256, hidden_size=96, num_hidden_layers=2, state_size=16, expand=2, conv_kernel=4,
              time_step_rank=6, use_cache=False)
# llama-shakespeare's recipe (lmc_fast/recipes.py) and train.py's AdamW betas / eps / clipping
BLOCK, BATCH = 64, 32
TRAIN = dict(steps=300, lr=3e-3, weight_decay=0.05, warmup=0.05, grad_clip=1.0, betas=(0.9, 0.98), eps=1e-8)
EVAL_BLOCKS = 512  # the first test blocks, as the grid sweeps (4 batches of 128)


def fresh_model(seed: int):
    """HF's own initialisation (MambaPreTrainedModel._init_weights: dt's bias from its dt range, A_log = log n),
    seeded as the recipes seed theirs."""
    import transformers

    seed_everything(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return transformers.MambaForCausalLM(transformers.MambaConfig(**CONFIG))


def _full(params: dict) -> dict:
    """The standard parameters with the tied head: one leaf serves as embedding and head, as in HF's model."""
    return {**params, "lm_head.weight": params["tok_embed.weight"]}


def logits_of(arch, params: dict, x: torch.Tensor) -> torch.Tensor:
    return Fn.forward(arch, {k: v.unsqueeze(0) for k, v in _full(params).items()}, x)[0]


def train_seed(seed: int, steps: int, log=print):
    model = fresh_model(seed)
    arch, std = standard_params(model)
    params = {k: v.detach().clone().float().requires_grad_(True) for k, v in std.items() if k != "lm_head.weight"}
    # decay on matrices only (train.py's rule); A_log is a matrix but HF marks it (and D) _no_weight_decay
    decay = [p for k, p in params.items() if p.dim() >= 2 and not k.endswith("A_log")]
    rest = [p for k, p in params.items() if not (p.dim() >= 2 and not k.endswith("A_log"))]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": TRAIN["weight_decay"]},
                             {"params": rest, "weight_decay": 0.0}], lr=TRAIN["lr"], betas=TRAIN["betas"],
                            eps=TRAIN["eps"])
    loader = Loader(load_shakespeare(BLOCK, "byte", "train"), BATCH, shuffle=True, seed=seed)
    warmup = int(round(TRAIN["warmup"] * steps))
    losses, curve, step, epoch = [], [], 0, 0
    t0 = time.perf_counter()
    while step < steps:
        loader.set_epoch(epoch)
        for x, y in loader:
            if step >= steps:
                break
            for g in opt.param_groups:
                g["lr"] = lr_at(step, steps, TRAIN["lr"], warmup)
            loss = task_loss(logits_of(arch, params, x), y, 0.0, "next_token")
            if not torch.isfinite(loss):
                raise FloatingPointError(f"seed {seed}: loss {loss.item()} at step {step}")
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(list(params.values()), TRAIN["grad_clip"])
            opt.step()
            losses.append(loss.item())
            step += 1
            if step % 100 == 0:
                curve.append(sum(losses[-100:]) / 100)
                log(f"  seed {seed} step {step}: loss {curve[-1]:.3f} ({time.perf_counter() - t0:.0f} s)")
        epoch += 1
    seconds = time.perf_counter() - t0
    final = {k: v.detach() for k, v in _full(params).items()}
    trained = adapter_for(model).build(model, final).eval()
    return trained, arch, final, {"steps": step, "seconds": seconds, "seconds_per_step": seconds / step,
                                  "train_loss": sum(losses[-100:]) / len(losses[-100:]), "loss_curve": curve}


@torch.no_grad()
def test_loss(arch, params: dict) -> dict:
    test = load_shakespeare(BLOCK, "byte", "test")
    total, n = 0.0, 0
    for x, y in Loader(test.subset(range(EVAL_BLOCKS)), 128):
        total += task_loss(logits_of(arch, params, x), y, 0.0, "next_token").item() * x.shape[0]
        n += x.shape[0]
    return {"test_loss": total / n, "test_ppl": math.exp(total / n), "test_blocks": n}


@torch.no_grad()
def check_build(arch, params: dict, model) -> float:
    """HF's logits of the built model against the functional forward it was trained by (HF runs its norms, A
    and logits in float32 too: they agree to float32 rounding)."""
    x = load_shakespeare(BLOCK, "byte", "test").x[:2]
    return (model(input_ids=x).logits - logits_of(arch, params, x)).abs().max().item()


def settings(steps: int) -> dict:
    return {"config": CONFIG, "block_size": BLOCK, "batch_size": BATCH, "train": {**TRAIN, "steps": steps},
            "trained_by": "bench/mamba_shakespeare.py (functional forward)", "data": "shakespeare"}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="data_cache/mamba")
    p.add_argument("--seeds", type=int, nargs="+", default=list(range(10)))
    p.add_argument("--steps", type=int, default=TRAIN["steps"])
    p.add_argument("--summary", help="also write every seed's metadata here (JSON), e.g. for bench/results/")
    args = p.parse_args()
    torch.set_num_threads(1)
    for seed in args.seeds:
        path = Path(args.out) / f"seed{seed}"
        # as the metadata reads back from JSON (tuples become lists), so a finished seed compares equal
        wanted = json.loads(json.dumps({**settings(args.steps), "seed": seed}))
        if path.exists():
            meta = getattr(load_model(path), "lmc_fast_metadata", {}) or {}
            if all(meta.get(k) == v for k, v in wanted.items()):
                print(f"seed {seed}: {path} has it (test ppl {meta['eval']['test_ppl']:.2f}), skipped")
                continue
        model, arch, params, history = train_seed(seed, args.steps)
        history["eval"] = test_loss(arch, params)
        history["hf_logits_max_diff"] = check_build(arch, params, model)
        save_model(model, path, metadata={**wanted, **history})
        print(f"seed {seed}: train loss {history['train_loss']:.3f}, test ppl {history['eval']['test_ppl']:.2f}, "
              f"{history['seconds']:.0f} s ({history['seconds_per_step']:.3f} s/step), "
              f"HF logits within {history['hf_logits_max_diff']:.1e} -> {path}", flush=True)
    if args.summary:
        metas = {f"seed{s}": load_model(Path(args.out) / f"seed{s}").lmc_fast_metadata for s in args.seeds}
        Path(args.summary).write_text(json.dumps(metas, indent=2) + "\n")


if __name__ == "__main__":
    main()
