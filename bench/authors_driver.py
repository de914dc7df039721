"""Runs the paper authors' merger on one pair, under THEIR venv (transformers 4.50); called by bench/authors_code.py.

    python bench/authors_driver.py --authors /tmp/authors --job JOB.json --out RESULT.json

The job (JSON, written by authors_code.py) names two Hugging Face GPT-2 folders, a safetensors file of
token blocks (test, training, the token counts, our logits of the first test batch), the task ("weight":
their GPTMerger with the token prior; "learned": that merger trained as their train_merger.py trains it),
their weight matching's iterations (15, theirs; 0 when B is already aligned by ours, so that their path and
training start from our alignment) and the lambdas. Nothing of lmc_fast is imported here (it needs transformers 5); their modules are imported
from --authors. Lambda is ours: 0 is model A, 1 is model B (their merger's coefficient is 1 - lambda).
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import sys
import time
from pathlib import Path


def fail(msg: str):
    raise SystemExit(f"authors_driver: {msg}")


def batches(x, size: int):
    return [x[i:i + size] for i in range(0, len(x), size)]


def evaluate(forward, blocks: list) -> dict:
    """Mean next-token cross-entropy and accuracy over the blocks, summed in float64: lmc_fast's MetricSums
    (targets are the inputs shifted by one, as there and in Hugging Face's labels)."""
    import torch
    import torch.nn.functional as F

    loss, hits, n = 0.0, 0.0, 0
    with torch.no_grad():
        for x in blocks:
            logits = forward(x).double()
            lg, tg = logits[:, :-1].reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1)
            loss += F.cross_entropy(lg, tg, reduction="sum").item()
            hits += (lg.argmax(-1) == tg).double().sum().item()
            n += tg.numel()
    return {"loss": loss / n, "acc": hits / n}


def load_pair(job):
    from transformers import GPT2LMHeadModel

    # eager attention, as their train_merger.build_merger_wrapper sets it
    return [GPT2LMHeadModel.from_pretrained(job[k], attn_implementation="eager").eval() for k in ("a", "b")]


class BlockSet:
    """Training blocks as their Trainer reads them: labels are the inputs (GPT-2 shifts them inside)."""

    def __init__(self, x):
        self.x = x

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"input_ids": self.x[i], "labels": self.x[i]}


def train(merger, config, train_x, val_x, job) -> dict:
    """Their train_merger.run_training_and_save, on our blocks: HF Trainer, AdamW (weight decay 0.01),
    cosine with 5% warm-up, clip 1, the narrow-uniform sampler (one lambda per forward), validation every
    50 steps (ours' paper preset; at the end of a shorter run) and the best validation merger kept (their load_best_model_at_end, held in memory instead of
    checkpoints on disk). Steps instead of epochs; the batch is our matching batch."""
    import tempfile

    from transformers import Trainer, TrainerCallback, TrainingArguments
    from merger import GPTMergerWrapper

    merger.set_sampler(sampler_type="narrow_uniform")
    model = GPTMergerWrapper(config=config, merger_model=merger)
    best = {"loss": math.inf, "state": None, "step": None}

    class KeepBest(TrainerCallback):
        def on_evaluate(self, args, state, control, metrics=None, **kw):
            if metrics and metrics.get("eval_loss", math.inf) < best["loss"]:
                best.update(loss=metrics["eval_loss"], step=state.global_step,
                            state=copy.deepcopy(merger.proj.state_dict()))

    with tempfile.TemporaryDirectory() as tmp:
        args = TrainingArguments(
            output_dir=tmp, max_steps=job["steps"], per_device_train_batch_size=job["batch_size"],
            per_device_eval_batch_size=job["batch_size"], learning_rate=job["lr"], lr_scheduler_type="cosine",
            warmup_ratio=0.05, weight_decay=0.01, max_grad_norm=1.0, eval_strategy="steps",
            eval_steps=min(job["eval_every"], job["steps"]), save_strategy="no", logging_strategy="no", report_to="none",
            use_cpu=True, seed=job["seed"], disable_tqdm=True, dataloader_num_workers=0)
        trainer = Trainer(model=model, args=args, train_dataset=BlockSet(train_x), eval_dataset=BlockSet(val_x),
                          callbacks=[KeepBest()])
        trainer.train()
    if best["state"] is not None:
        merger.proj.load_state_dict(best["state"])
    return {"best_val_loss": best["loss"], "best_step": best["step"], "steps": job["steps"]}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--authors", required=True, help="a work tree of the authors' repository (merger.py ...)")
    p.add_argument("--job", required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    authors = Path(args.authors)
    if not (authors / "merger.py").is_file():
        fail(f"{authors}: no merger.py (not a work tree of the authors' repository)")
    sys.path.insert(0, str(authors.resolve()))
    try:
        job = json.loads(Path(args.job).read_text())
    except (OSError, ValueError) as exc:
        fail(f"{args.job}: cannot read the job ({exc})")

    import torch
    import transformers
    from safetensors.torch import load_file
    from transformers import set_seed

    torch.set_num_threads(job["threads"])
    from merger import GPTMerger  # their code

    data = load_file(job["data"])
    test = batches(data["test_x"], job["eval_batch_size"])
    a, b = load_pair(job)
    # the exported models under this transformers: logits against ours, losses on the test blocks
    check = {"logits_max_abs_diff": {k: (m(input_ids=test[0]).logits - data[f"logits_{k}"]).abs().max().item()
                                     for k, m in (("a", a), ("b", b)) if f"logits_{k}" in data},
             "plain": {k: evaluate(lambda x, m=m: m(input_ids=x).logits, test) for k, m in (("a", a), ("b", b))}}
    counts = data["counts"]
    set_seed(job["seed"])  # their merger's initial projections are random (identity + noise)
    t0 = time.perf_counter()
    # their weight matching (15 iterations; 0 when B comes already aligned by ours) and merger
    merger = GPTMerger(a, b, token_freqs=counts, iterations=job.get("iterations", 15))
    seconds = {"merger": time.perf_counter() - t0}
    info = {}
    if job["task"] == "learned":
        n = job["n_train"]
        t0 = time.perf_counter()
        info = train(merger, copy.deepcopy(a.config), data["train_x"][:n], data["train_x"][n:], job)
        seconds["train"] = time.perf_counter() - t0
    seconds["solve"] = sum(seconds.values())
    merger.eval()
    curve = []
    for lam in job["lambdas"]:
        merger.set_sampler(sampler_type=None, fixed_coeff=1.0 - lam)  # their coefficient weighs model A
        curve.append({"lambda": lam, **evaluate(lambda x: merger(input_ids=x).logits, test)})
    out = {"task": job["task"], "seconds": seconds, "curve": curve, "check": check, "info": info,
           "torch": torch.__version__, "transformers": transformers.__version__,
           "threads": torch.get_num_threads()}
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
