"""The paper authors' own code against ours on Table 1's Shakespeare GPT-2 pairs, one evaluator, one run.

    python bench/authors_code.py --authors /tmp/authors --venv /tmp/peers/venv --pairs all

--authors: a work tree of antoniohonsell/Generalized-LMC-for-Transformers (e.g. `git -C MIRROR archive HEAD |
tar -x -C /tmp/authors`); --venv: a venv where their code runs (torch, transformers 4.50.1, accelerate for
their Trainer, pot, einops, scipy, numpy, safetensors: under transformers 5.x it fails its own check). Their code
runs as a subprocess of that venv (bench/authors_driver.py, importing their modules from --authors); nothing of theirs is copied here. Per pair, alternately (the order flips from pair to pair, so
a drifting machine load hits both sides alike):
- theirs WM+prior: `merger.GPTMerger(A, B, token_freqs)`, their weight matching with the token prior;
- ours WM+prior: `lf.align(a, b, "weight", token_counts=counts)`;
- theirs learned: that merger trained as their train_merger.py trains it (HF Trainer: AdamW, weight decay
  0.01, cosine with 5% warm-up, clip 1, lambda ~ U[0.4, 0.6] one per step), --steps at --lr;
- ours learned, `preset="paper"` at --steps and --lr, with the library's settings of
  bench/grids/table1_shakespeare.toml [methods.learned] at --steps, and `preset="labels"` (the library's
  default for these models) at --steps and at --long-steps.
Same models (exported to Hugging Face's GPT-2 and checked: logits equal ours), same data as the Table 1
grid (its test blocks; matching on its 60 training batches, the token counts from them; both learned runs
train on the same 90% and validate on the same 10%), the same 11 lambdas, and one evaluator: mean token
cross-entropy in float64 over the test blocks, the barrier from lmc_fast's `barrier_result` for both sides.
Seconds are the solve alone (their merger's construction and training; our `lf.align`), one torch thread.
Writes bench/results/authors_code.{json,md}.
"""
from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
SPEC = BENCH / "grids" / "table1_shakespeare.toml"
DRIVER = BENCH / "authors_driver.py"
#: (column, side, what it runs)
COLUMNS = (("theirs_wm", "theirs", "GPTMerger(A, B, token_freqs): their weight matching with the token prior"),
           ("ours_wm", "ours", 'lf.align(a, b, "weight", token_counts=counts)'),
           ("theirs_learned", "theirs", "their merger trained by their train_merger.py settings (HF Trainer)"),
           ("ours_paper", "ours", 'lf.align(a, b, "learned", preset="paper")'),
           ("ours_default", "ours", "lf.align(a, b, \"learned\", **table1_shakespeare.toml [methods.learned])"),
           ("ours_their_loop", "ours", 'lf.align(a, b, "learned", preset="paper") with their loop: one lambda a '
            'step, AdamW weight decay 0.01, 5% warm-up, clip 1'),
           ("ours_labels", "ours", 'lf.align(a, b, "learned", preset="labels"): the library\'s default for end models '
            'that have not memorised their data (distill\'s settings with the task loss), --steps'),
           ("ours_labels_long", "ours", 'the same at --long-steps'),
           ("ours_labels_their_loop", "ours", 'preset="labels" at --long-steps with their loop (one lambda a step, so '
            'about the cost of --steps two-lambda steps; AdamW weight decay 0.01, 5% warm-up, clip 1)'),
           # start and parametrisation apart: their merger (QK/OV circuits, RMSNorm with bias) fed B already
           # aligned by our weight matching, their own weight matching skipped (0 iterations)
           # (their seconds include our weight matching's)
           ("theirs_path_ours_wm", "theirs", "our weight matching + prior (ours_wm's alignment), evaluated on their "
            "merger's path (QK/OV circuits), their weight matching skipped"),
           ("theirs_learned_ours_wm", "theirs", "their learned training (theirs_learned's loop and parametrisation) "
            "started from ours_wm's alignment instead of their weight matching"))
#: their train_merger.py's loop in our options (what is left between them is the parametrisation)
THEIR_LOOP = {"lambdas_per_step": 1, "weight_decay": 0.01, "warmup": 0.05, "clip": 1.0}
#: ours against theirs, per pair: (ratio name, ours, theirs)
RATIOS = (("wm", "ours_wm", "theirs_wm"), ("learned_paper", "ours_paper", "theirs_learned"),
          ("learned_default", "ours_default", "theirs_learned"), ("their_loop", "ours_their_loop", "theirs_learned"),
          ("learned_labels", "ours_labels", "theirs_learned"), ("learned_labels_long", "ours_labels_long", "theirs_learned"),
          ("learned_labels_their_loop", "ours_labels_their_loop", "theirs_learned"),
          # the start, on their path: our weight matching / theirs
          ("start_wm", "theirs_path_ours_wm", "theirs_wm"), ("start_learned", "theirs_learned_ours_wm", "theirs_learned"),
          # the parametrisation, from our start: our path / theirs
          ("path_wm", "ours_wm", "theirs_path_ours_wm"), ("path_learned", "ours_their_loop", "theirs_learned_ours_wm"))
AUTHOR_FILES = ("merger.py", "weight_matching.py", "utils.py", "train_merger.py")
#: the exported model's logits against ours (float32, same operations in another order)
EXPORT_TOL = 2e-5


def fail(msg: str):
    raise SystemExit(f"authors_code: {msg}")


def parse_pairs(text: str, n_models: int) -> list[tuple[int, int]]:
    """"all" (Table 1's pairs) or "0,1 2,3" -> [(0, 1), (2, 3)]; anything else is refused in one line."""
    if text == "all":
        from common import TABLE1_PAIRS

        return [tuple(p) for p in TABLE1_PAIRS]
    pairs = []
    for item in text.replace(";", " ").split():
        parts = item.split(",")
        if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
            fail(f"--pairs: {item!r} is not a pair of seeds like 0,1 (or give 'all')")
        i, j = (int(p) for p in parts)
        if i == j or max(i, j) >= n_models:
            fail(f"--pairs: {item!r} needs two different seeds below {n_models}")
        pairs.append((i, j))
    if not pairs:
        fail("--pairs: no pair given (e.g. --pairs all, or --pairs '0,1 2,3')")
    return pairs


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--authors", required=True, help="work tree of the authors' repository")
    p.add_argument("--venv", required=True, help="venv running their code (transformers 4.50)")
    p.add_argument("--pairs", default="all", help="'all' (Table 1's 5 pairs) or seeds like '0,1 2,3'")
    p.add_argument("--models", default="/tmp/lmc_grids/ls_shakespeare/models", help="folder of seedN models")
    p.add_argument("--steps", type=int, default=300, help="steps of every learned run")
    p.add_argument("--lr", type=float, default=3e-3, help="theirs learned and ours preset='paper'")
    p.add_argument("--long-steps", type=int, default=600, help="steps of ours_labels_long and ours_labels_their_loop")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work", default="/tmp/authors_code", help="scratch folder: exported models, data, jobs")
    p.add_argument("--out", default=str(BENCH / "results" / "authors_code"), help="OUT.json and OUT.md")
    p.add_argument("--columns", nargs="+", choices=[c for c, _, _ in COLUMNS],
                   help="run only these columns: added to the pairs of OUT.json where it exists (same pairs, "
                        "steps, lr), else a new study of these columns alone")
    args = p.parse_args(argv)
    if args.steps < 1 or args.long_steps < 1 or not args.lr > 0:
        fail("--steps and --long-steps must be at least 1 and --lr positive")
    new_study = args.columns and not Path(args.out).with_suffix(".json").is_file()
    if new_study and not {"theirs_wm", "theirs_learned"} & set(args.columns):
        fail("--columns: a new study needs theirs_wm or theirs_learned too (the checks of their code read them)")
    return args


def check_inputs(args) -> Path:
    """The authors' tree, their venv's python and the model folders, each refused in one line."""
    authors = Path(args.authors)
    missing = [f for f in AUTHOR_FILES if not (authors / f).is_file()]
    if missing:
        fail(f"--authors {authors}: no {missing[0]} (a work tree of the authors' repository is needed)")
    python = Path(args.venv) / "bin" / "python"
    if not python.is_file():
        fail(f"--venv {args.venv}: no bin/python")
    return python


# ---- the models in Hugging Face's layout, checked
def hf_config(model) -> dict:
    """GPT2Config fields of our reference GPT-2 (written by hand: read by transformers 4.50 as well as 5)."""
    c = model.config
    if c.norm != "layernorm" or c.activation != "gelu_tanh" or not c.qkv_bias:
        fail(f"only GPT-2s with LayerNorm, gelu_tanh and q/k/v biases map to GPT2LMHeadModel (got norm={c.norm}, "
             f"activation={c.activation}, qkv_bias={c.qkv_bias})")
    return {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_layer": c.n_layer, "n_embd": c.n_embd,
            "n_head": c.n_head, "n_inner": c.d_mlp, "vocab_size": c.vocab_size, "n_positions": c.block_size,
            "n_ctx": c.block_size, "layer_norm_epsilon": c.eps, "activation_function": "gelu_new",
            "attn_pdrop": 0.0, "embd_pdrop": 0.0, "resid_pdrop": 0.0, "scale_attn_weights": True,
            "scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False,
            "tie_word_embeddings": bool(c.tie_word_embeddings), "use_cache": False, "bos_token_id": None,
            "eos_token_id": None}


def to_hf(model):
    """Our GPT-2 as a transformers.GPT2LMHeadModel, through the adapters (reference -> standard -> HF)."""
    import transformers

    from lmc_fast.models.adapters import adapter_for
    from lmc_fast.models.adapters.hf_gpt2 import HFGPT2Adapter

    cfg = {k: v for k, v in hf_config(model).items() if k not in ("model_type", "architectures")}
    template = transformers.GPT2LMHeadModel(transformers.GPT2Config(**cfg)).eval()
    return HFGPT2Adapter().build(template, adapter_for(model).get(model)).eval()


def export(model, folder: Path) -> None:
    """config.json + model.safetensors that GPT2LMHeadModel.from_pretrained reads (a tied head stored once)."""
    from safetensors.torch import save_file

    hf = to_hf(model)
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous() for k, v in hf.state_dict().items()}
    if hf.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(hf_config(model), indent=2) + "\n")


def export_error(model, blocks) -> float:
    """Largest |logit difference| of the Hugging Face model against ours over the blocks."""
    import torch

    hf = to_hf(model)
    with torch.no_grad():
        return max((hf(input_ids=x).logits - model(x)).abs().max().item() for x, _ in blocks)


# ---- data as the Table 1 grid reads it
def grid_data(spec):
    """(test batches, matching batches) exactly as lmc_fast/grid/runner.py's eval_batches / match_batches make
    them for this spec (the grid's own helpers)."""
    from lmc_fast.grid.runner import _batches, _data

    train_ds, test_ds = _data(spec)
    test = _batches(test_ds if spec.split == "test" else train_ds, spec.batch_size, False, spec.max_batches, "cpu")
    match = _batches(train_ds, spec.match_batch_size, True, spec.match_max_batches, "cpu")
    return test, match


# ---- the two sides
def run_theirs(python: Path, authors: Path, job: dict, work: Path) -> dict:
    name = f"{job['pair'][0]}_{job['pair'][1]}_{job['column']}"
    job_path, out = work / f"job_{name}.json", work / f"result_{name}.json"
    job_path.write_text(json.dumps(job, indent=2) + "\n")
    out.unlink(missing_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(job["threads"]), "MKL_NUM_THREADS": str(job["threads"]),
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.pop("PYTHONPATH", None)  # their venv sees none of ours
    t0 = time.perf_counter()
    proc = subprocess.run([str(python), str(DRIVER), "--authors", str(authors), "--job", str(job_path),
                           "--out", str(out)], env=env, cwd=work, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0 or not out.is_file():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        (work / f"stderr_{name}.txt").write_text(proc.stderr)
        fail(f"their {job['task']} run on pair {job['pair']} failed (exit {proc.returncode}): {tail[0]} "
             f"(full log: {work / f'stderr_{name}.txt'})")
    res = json.loads(out.read_text())
    res["process_seconds"] = wall
    return res


def curve_barrier(curve: list[dict]) -> dict:
    """lmc_fast's barrier of a (lambda, loss, acc) curve: the same function our sweeps end in."""
    from lmc_fast.sweep.result import barrier_result

    by_lam = {r["lambda"]: {"loss": r["loss"], "acc": r["acc"], "ece": None} for r in curve}
    res = barrier_result([r["lambda"] for r in curve], by_lam, "theirs", "authors", 0.0)
    return {"barrier": res.barrier, "loss": res.loss, "acc": res.acc, "signed": res.signed,
            "loss_a": res.loss_a, "loss_b": res.loss_b}


def ours(a, b, test, lambdas, method: str, **options) -> dict:
    import lmc_fast as lf

    t0 = time.perf_counter()
    al = lf.align(a, b, method, **options)
    seconds = time.perf_counter() - t0
    res = lf.barrier(a, al.apply(b), test, lambdas)
    info = {k: al.info[k] for k in ("iterations", "steps", "best_step", "preset", "init", "seconds") if k in al.info}
    return {"barrier": res.barrier, "loss": res.loss, "acc": res.acc, "signed": res.signed, "loss_a": res.loss_a,
            "loss_b": res.loss_b, "seconds": seconds, "info": info}


def pair_record(k: int, seeds, args, ctx) -> dict:
    import torch

    import lmc_fast as lf
    from lmc_fast.io import load_model

    a, b = (load_model(Path(args.models) / f"seed{s}") for s in seeds)
    work = Path(args.work)
    dirs = {}
    logits = {}
    for side, m, s in (("a", a, seeds[0]), ("b", b, seeds[1])):
        dirs[side] = work / f"hf_seed{s}"
        export(m, dirs[side])
        with torch.no_grad():
            logits[f"logits_{side}"] = m(ctx["test"][0][0]).contiguous()
    export_err = {side: export_error(m, ctx["test"]) for side, m in (("a", a), ("b", b))}
    if max(export_err.values()) > EXPORT_TOL:
        fail(f"pair {seeds}: the Hugging Face export differs from our model by {max(export_err.values()):.2e} "
             f"(> {EXPORT_TOL}) in the logits")
    from safetensors.torch import save_file

    data_path = work / f"data_{seeds[0]}_{seeds[1]}.safetensors"
    save_file({**ctx["arrays"], **logits}, str(data_path))
    ends = {side: lf.evaluate(m, ctx["test"])["loss"] for side, m in (("a", a), ("b", b))}
    base = {"pair": list(seeds), "a": str(dirs["a"]), "b": str(dirs["b"]), "data": str(data_path),
            "lambdas": ctx["lambdas"], "eval_batch_size": ctx["eval_batch_size"], "threads": 1, "seed": args.seed}
    learned_job = {"task": "learned", "steps": args.steps, "lr": args.lr, "batch_size": ctx["match_batch_size"],
                   "n_train": ctx["n_train"], "eval_every": ctx["paper_eval_every"]}

    aligned = {}  # B aligned by our weight matching: its folder, data file and seconds (made once a pair)

    def from_ours_wm() -> dict:
        """base with B replaced by B aligned by our weight matching, their WM skipped."""
        if not aligned:
            t0 = time.perf_counter()
            al = lf.align(a, b, "weight", token_counts=ctx["counts"], seed=args.seed)
            aligned["seconds"] = time.perf_counter() - t0
            b_al = al.apply(b)
            aligned["b"] = work / f"hf_seed{seeds[1]}_ours_wm_to_{seeds[0]}"
            export(b_al, aligned["b"])
            err = export_error(b_al, ctx["test"])
            if err > EXPORT_TOL:
                fail(f"pair {seeds}: the aligned B's Hugging Face export differs from it by {err:.2e} in the logits")
            with torch.no_grad():
                arrays = {**ctx["arrays"], **logits, "logits_b": b_al(ctx["test"][0][0]).contiguous()}
            aligned["data"] = work / f"data_{seeds[0]}_{seeds[1]}_ours_wm.safetensors"
            save_file(arrays, str(aligned["data"]))
        return {**base, "b": str(aligned["b"]), "data": str(aligned["data"]), "iterations": 0}

    def theirs(column: str, job: dict) -> dict:
        res = run_theirs(ctx["python"], Path(args.authors), {**job, "column": column}, work)
        if job.get("iterations") == 0:  # the solve includes our weight matching, which replaced theirs
            res["seconds"]["ours_wm"] = aligned["seconds"]
            res["seconds"]["solve"] += aligned["seconds"]
        return res

    jobs = {
        "theirs_wm": lambda: theirs("theirs_wm", {**base, "task": "weight"}),
        "theirs_learned": lambda: theirs("theirs_learned", {**base, **learned_job}),
        "theirs_path_ours_wm": lambda: theirs("theirs_path_ours_wm", {**from_ours_wm(), "task": "weight"}),
        "theirs_learned_ours_wm": lambda: theirs("theirs_learned_ours_wm", {**from_ours_wm(), **learned_job}),
        "ours_wm": lambda: ours(a, b, ctx["test"], ctx["lambdas"], "weight", token_counts=ctx["counts"],
                                seed=args.seed),
        "ours_paper": lambda: ours(a, b, ctx["test"], ctx["lambdas"], "learned", data=ctx["match"], preset="paper",
                                   steps=args.steps, lr=args.lr, seed=args.seed),
        "ours_default": lambda: ours(a, b, ctx["test"], ctx["lambdas"], "learned", data=ctx["match"],
                                     **{**ctx["default_options"], "steps": args.steps}, seed=args.seed),
        "ours_their_loop": lambda: ours(a, b, ctx["test"], ctx["lambdas"], "learned", data=ctx["match"],
                                        preset="paper", steps=args.steps, lr=args.lr, seed=args.seed, **THEIR_LOOP),
        "ours_labels": lambda: ours(a, b, ctx["test"], ctx["lambdas"], "learned", data=ctx["match"], preset="labels",
                                    steps=args.steps, seed=args.seed),
        "ours_labels_long": lambda: ours(a, b, ctx["test"], ctx["lambdas"], "learned", data=ctx["match"],
                                         preset="labels", steps=args.long_steps, seed=args.seed),
        "ours_labels_their_loop": lambda: ours(a, b, ctx["test"], ctx["lambdas"], "learned", data=ctx["match"],
                                               preset="labels", steps=args.long_steps, seed=args.seed, **THEIR_LOOP),
    }
    # alternate who goes first, pair by pair: theirs then ours, then ours then theirs
    order = [("theirs_wm", "ours_wm"), ("theirs_learned", "ours_paper"), ("ours_default",), ("ours_their_loop",),
             ("ours_labels", "ours_labels_long"), ("ours_labels_their_loop",), ("theirs_path_ours_wm",),
             ("theirs_learned_ours_wm",)]
    if args.columns:
        order = [[c for c in o if c in args.columns] for o in order]
    order = [list(o) if k % 2 == 0 else list(reversed(o)) for o in order if o]
    rec = {"seeds": list(seeds), "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
           "load_average": os.getloadavg(), "order": [c for o in order for c in o], "export_max_abs_logit_diff": export_err,
           "ours_end_losses": ends, "columns": {}}
    for group in order:
        for col in group:
            t0 = time.perf_counter()
            r = jobs[col]()
            if col.startswith("theirs"):
                r = {**curve_barrier(r["curve"]), "seconds": r["seconds"]["solve"], "seconds_parts": r["seconds"],
                     "process_seconds": r["process_seconds"], "check": r["check"], "info": r["info"],
                     "torch": r["torch"], "transformers": r["transformers"]}
                # their endpoints (merger at coefficient 1 and 0, and the plain exported models) against ours
                r["end_loss_diff"] = {"merger_a": r["loss_a"] - ends["a"], "merger_b": r["loss_b"] - ends["b"],
                                      "plain_a": r["check"]["plain"]["a"]["loss"] - ends["a"],
                                      "plain_b": r["check"]["plain"]["b"]["loss"] - ends["b"]}
            rec["columns"][col] = r
            print(f"  pair {seeds} {col:15s} barrier {r['barrier']:.4f}  {r['seconds']:7.2f} s "
                  f"(total {time.perf_counter() - t0:.1f} s)", flush=True)
    return rec


def ratios(columns: dict) -> dict:
    """Ours / theirs per comparison whose two columns a pair has."""
    return {name: {"barrier": columns[o]["barrier"] / columns[t]["barrier"],
                   "seconds": columns[o]["seconds"] / columns[t]["seconds"]}
            for name, o, t in RATIOS if o in columns and t in columns}


def stats(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "values": values}


def summary(records: list[dict]) -> dict:
    """Medians over the pairs of every column (and ratio) all the pairs have."""
    cols = {c: {q: stats([r["columns"][c][q] for r in records]) for q in ("barrier", "seconds")}
            for c, _, _ in COLUMNS if all(c in r["columns"] for r in records)}
    rat = {n: {q: stats([r["ratios"][n][q] for r in records]) for q in ("barrier", "seconds")}
           for n, _, _ in RATIOS if all(n in r["ratios"] for r in records)}
    return {"columns": cols, "ratios": rat}


def fmt(s: dict, digits: int) -> str:
    return f"{s['median']:.{digits}f} [{s['min']:.{digits}f}, {s['max']:.{digits}f}]"


def markdown(result: dict) -> str:
    names = [c for c, _, _ in COLUMNS if c in result["summary"]["columns"]]
    out = [f"The authors' code against ours on {len(result['pairs'])} Shakespeare GPT-2 pair(s) of Table 1, "
           f"{result['steps']} learned steps; loss barrier / seconds of the solve (one thread), test blocks "
           f"{result['test_blocks']}, lambdas {len(result['lambdas'])}"
           + (f"; ours_labels_long and ours_labels_their_loop: {result['long_steps']} steps"
              if {"ours_labels_long", "ours_labels_their_loop"} & set(names) else "") + ".", "",
           "| pair | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for r in result["records"]:
        out.append(f"| {tuple(r['seeds'])} | " + " | ".join(
            f"{r['columns'][c]['barrier']:.4f} / {r['columns'][c]['seconds']:.2f} s" for c in names) + " |")
    s = result["summary"]
    out.append("| median [min, max] | " + " | ".join(
        f"{fmt(s['columns'][c]['barrier'], 4)} / {fmt(s['columns'][c]['seconds'], 2)} s" for c in names) + " |")
    out += ["", "Ratios per pair, median [min, max] (ours / theirs; then our start / theirs on their path, and "
            "our path / theirs from our start):", "", "| comparison | barrier ratio | seconds ratio |",
            "|---|---:|---:|"]
    for n, o, t in RATIOS:
        if n not in s["ratios"]:
            continue
        out.append(f"| {o} / {t} | {fmt(s['ratios'][n]['barrier'], 3)} | {fmt(s['ratios'][n]['seconds'], 3)} |")
    chk = result["checks"]
    out += ["", f"Checks: exported GPT2LMHeadModel logits against ours, max |diff| {chk['export_max']:.1e} "
            f"(transformers {result['versions']['ours']['transformers']}) and {chk['their_logits_max']:.1e} "
            f"(transformers {result['versions']['theirs']['transformers']}); their endpoint losses against "
            f"`lf.evaluate`, max |diff| {chk['end_loss_max']:.1e}.", ""]
    out += [f"- {c}: {what}" for c, _, what in COLUMNS if c in names]
    return "\n".join(out) + "\n"


def spec_vocab(args, pairs) -> int:
    """The models' vocabulary (the token counts' length), read from the first model's config."""
    cfg = json.loads((Path(args.models) / f"seed{pairs[0][0]}" / "config.json").read_text())
    return int(cfg["config"]["vocab_size"])


def add_columns(args, pairs, ctx, started, load_start, write_study) -> None:
    """--columns: those columns run on every pair of the existing OUT.json and added to its records."""
    path = Path(args.out).with_suffix(".json")
    try:
        result = json.loads(path.read_text())
        records = result["records"]
        same = ([list(p) for p in pairs] == result["pairs"] and result["steps"] == args.steps
                and result["lr"] == args.lr and result["seed"] == args.seed
                and result.get("long_steps", args.long_steps) == args.long_steps)
    except (ValueError, KeyError, TypeError) as exc:
        fail(f"{path} is not a record of this bench ({type(exc).__name__}: {exc})")
    if not same:
        fail(f"{path} was made for pairs {result['pairs']}, steps {result['steps']}, lr {result['lr']}, seed "
             f"{result['seed']}, long steps {result.get('long_steps')}: give the same --pairs, --steps, --lr, "
             f"--seed and --long-steps")
    for k, (seeds, rec) in enumerate(zip(pairs, records)):
        print(f"pair {seeds}", flush=True)
        new = pair_record(k, seeds, args, ctx)
        rec["columns"].update(new["columns"])
        rec.setdefault("added", []).append({"columns": args.columns, "date": new["date"],
                                            "load_average": new["load_average"]})
        rec["ratios"] = ratios(rec["columns"])
    result["columns"] = {c: what for c, _, what in COLUMNS if all(c in r["columns"] for r in records)}
    result.setdefault("added", []).append({"columns": args.columns, "started": started,
                                           "finished": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                                           "load_average": {"start": load_start, "end": os.getloadavg()}})
    result["summary"] = summary(records)
    out = write_study(args.out, result, markdown(result))
    print(f"-> {out}.json, {out}.md")


def main(argv=None):
    args = parse_args(argv)
    sys.path.insert(0, str(BENCH))
    python = check_inputs(args)
    from lmc_fast.grid.spec import load_spec

    spec = load_spec(SPEC)
    pairs = parse_pairs(args.pairs, len(spec.seeds))
    missing = [s for p in pairs for s in p if not (Path(args.models) / f"seed{s}" / "config.json").is_file()]
    if missing:
        fail(f"--models {args.models}: no seed{missing[0]} model (train them with the Table 1 grid)")

    import torch
    import transformers

    from common import cpu_model, write_study
    from lmc_fast.match.learned import PRESETS, split_batches

    torch.set_num_threads(1)
    Path(args.work).mkdir(parents=True, exist_ok=True)
    test, match = grid_data(spec)
    # our paper-preset run keeps the last 10% of the matching batches for validation: theirs too
    paper = PRESETS["paper"]
    train_part, _ = split_batches(match, paper["val_fraction"])
    n_train = sum(len(x) for x, _ in train_part)
    match_x = torch.cat([x for x, _ in match])
    counts = torch.bincount(match_x.reshape(-1), minlength=spec_vocab(args, pairs))
    ctx = {"python": python, "test": test, "match": match, "counts": counts, "n_train": n_train,
           "lambdas": list(spec.lambdas), "eval_batch_size": spec.batch_size,
           "match_batch_size": spec.match_batch_size, "paper_eval_every": paper["eval_every"],
           "default_options": dict(spec.options["learned"]),
           "arrays": {"test_x": torch.cat([x for x, _ in test]).contiguous(), "train_x": match_x.contiguous(),
                      "counts": counts}}
    started = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    load_start = os.getloadavg()
    if args.columns and Path(args.out).with_suffix(".json").is_file():
        return add_columns(args, pairs, ctx, started, load_start, write_study)
    records = []
    for k, seeds in enumerate(pairs):
        print(f"pair {seeds}", flush=True)
        records.append(pair_record(k, seeds, args, ctx))
        records[-1]["ratios"] = ratios(records[-1]["columns"])
    theirs_cols = [c for c in ("theirs_wm", "theirs_learned") if c in records[0]["columns"]]
    theirs0 = records[0]["columns"][theirs_cols[0]]
    checks = {
        "export_max": max(v for r in records for v in r["export_max_abs_logit_diff"].values()),
        "their_logits_max": max(v for r in records for c in theirs_cols
                                for v in r["columns"][c]["check"]["logits_max_abs_diff"].values()),
        "end_loss_max": max(abs(v) for r in records for c in theirs_cols
                            for v in r["columns"][c]["end_loss_diff"].values()),
    }
    result = {
        "kind": "authors_code", "machine": cpu_model(), "torch_threads": 1,
        "versions": {"ours": {"torch": torch.__version__, "transformers": transformers.__version__},
                     "theirs": {"torch": theirs0["torch"], "transformers": theirs0["transformers"]}},
        "authors": {"path": str(Path(args.authors).resolve()),
                    "sha256": {f: hashlib.sha256((Path(args.authors) / f).read_bytes()).hexdigest()
                               for f in AUTHOR_FILES}},
        "started": started, "finished": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "load_average": {"start": load_start, "end": os.getloadavg()},
        "spec": str(SPEC.relative_to(BENCH.parent)), "models": str(args.models), "pairs": [list(p) for p in pairs],
        "steps": args.steps, "long_steps": args.long_steps, "lr": args.lr, "seed": args.seed,
        "lambdas": list(spec.lambdas),
        "test_blocks": int(ctx["arrays"]["test_x"].shape[0]), "match_blocks": int(match_x.shape[0]),
        "learned_train_blocks": n_train, "default_learned_options": ctx["default_options"],
        "paper_learned_options": {**paper, "steps": args.steps, "lr": args.lr},
        "columns": {c: what for c, _, what in COLUMNS if c in records[0]["columns"]}, "checks": checks,
        "summary": summary(records), "records": records,
    }
    out = write_study(args.out, result, markdown(result))
    print(f"-> {out}.json, {out}.md")


if __name__ == "__main__":
    main()
