"""Instability analysis (Frankle et al. 2020, "Linear Mode Connectivity and the Lottery Ticket
Hypothesis"), with Transformer symmetries.

    from lmc_fast.instability import instability, format_table
    result = instability("gpt2-shakespeare", "runs/instab", spawn_steps=(0, 50, 100, 200), copies=2, steps=400)
    print(format_table(result))

One parent run trains from the recipe's seeded initialisation to each spawn step k. At each k,
`copies` children fork from it (weights and AdamW state) and train on to the end, each on
its own data order; the learning-rate schedule is the parent's (one run of `steps` steps).
For every pair of children the barrier on the test split is measured on raw parameters
("none") and after weight matching ("weight"). A network is *stable* at k when its children
end in one linearly connected region; the symmetry-aware column says how much of the raw
barrier was only a permutation / rotation of the same solution.

Resumable: every finished unit is saved under `out` (atomically) and reused by a re-run
with the same settings (a run with other settings is refused):

    out/settings.json                         what the units were trained with
    out/parent/step{k}/                       parent at step k (model + optimizer.safetensors)
    out/children/spawn{k}/copy{c}/            child c of spawn step k, trained to the end
    out/instability.json, out/instability.png the table and the plot of barrier vs spawn step
"""
from __future__ import annotations

import dataclasses
import datetime
import itertools
import json
import math
import numbers
import time
from pathlib import Path

import numpy as np
import torch

from .atomic import atomic_file, write_json
from .errors import CheckpointError
from .machine import machine_info
from .match.methods import REGISTRY

FORMAT = "lmc_fast.instability/1"
#: the data-free methods of the registry: no training batches to choose, nothing learned per pair
METHODS = tuple(m.name for m in REGISTRY.values() if not m.needs_data)
OPTIMIZER_FILE = "optimizer.safetensors"


# ---------------------------------------------------------------- arguments
def _recipe(recipe):
    from .recipes import Recipe, recipe as by_name

    if isinstance(recipe, Recipe):
        return recipe
    try:
        return by_name(recipe)
    except KeyError as exc:
        raise ValueError(exc.args[0]) from None


def total_steps(r) -> int:
    """The recipe's training length in optimiser steps (its `steps`, or its epochs of batches)."""
    if "steps" in r.hparams:
        return int(r.hparams["steps"])
    train_ds, _ = r.datasets()
    per_epoch = math.ceil(len(train_ds) / r.batch_size)
    return max(1, int(round(r.hparams.get("epochs", 1) * per_epoch)))


def _int(name: str, value, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    return int(value)


def check_spawn_steps(spawn_steps, steps: int) -> list[int]:
    """Sorted distinct spawn steps, each an int in [0, steps)."""
    if isinstance(spawn_steps, (str, bytes)) or not hasattr(spawn_steps, "__iter__"):
        raise ValueError(f"spawn_steps must be a list of ints, got {spawn_steps!r}")
    out = sorted({_int("each spawn step", k, 0) for k in spawn_steps})
    if not out:
        raise ValueError("spawn_steps must name at least one step")
    late = [k for k in out if k >= steps]
    if late:
        raise ValueError(f"spawn steps must be < the total steps ({steps}): got {late}")
    return out


# ---------------------------------------------------------------- training segments
class _Stream:
    """The batch of any step of one data order: order (seed, stream, epoch) shuffles the training
    set, so a segment started at step k reads what an unbroken run would (resumes are exact)."""

    def __init__(self, dataset, batch_size: int, seed: int, stream: int):
        self.dataset, self.batch_size, self.seed, self.stream = dataset, batch_size, seed, stream
        self.per_epoch = math.ceil(len(dataset) / batch_size)
        self._epoch, self._order = None, None

    def batch(self, step: int):
        epoch, b = divmod(step, self.per_epoch)
        if epoch != self._epoch:
            rng = np.random.default_rng([self.seed, self.stream, epoch])
            self._epoch, self._order = epoch, torch.from_numpy(rng.permutation(len(self.dataset)))
        return self.dataset[self._order[b * self.batch_size:(b + 1) * self.batch_size]]


def _train_segment(model, opt, stream: _Stream, start: int, end: int, total: int, hp: dict, device) -> list[float]:
    """Steps [start, end) of a `total`-step run of `lmc_fast.train`'s recipe (AdamW, warm-up then
    cosine, gradient clipping at 1); returns the losses."""
    from .models.adapters import adapter_for
    from .sweep.checks import check_batch, spec_from_model
    from .sweep.metrics import has_kept_targets, task_loss, task_of
    from .train import lr_at

    adapter, spec = adapter_for(model), spec_from_model(model)
    task = task_of(adapter.arch(model))
    warmup = hp.get("warmup", 0.1)
    warmup_steps = int(round(warmup * total)) if warmup < 1 else int(warmup)
    dtype = next(model.parameters()).dtype
    losses = []
    model.train()
    for step in range(start, end):
        x, y = stream.batch(step)
        check_batch(spec, x, y)
        x = x.to(device=device, dtype=dtype) if x.is_floating_point() else x.to(device)
        y = y.to(device)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, total, hp["lr"], warmup_steps)
        logits = adapter.logits(model, x)
        loss = task_loss(logits, y, hp.get("label_smoothing", 0.0), task)
        if not torch.isfinite(loss):
            raise FloatingPointError(f"loss became {loss.item()} at step {step} (lower lr?)")
        if has_kept_targets(logits, y, task):
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            losses.append(loss.item())
    model.eval()
    return losses


def _new_optimizer(model, hp: dict):
    from .train import _optimizer

    return _optimizer(model, hp["lr"], hp.get("weight_decay", 0.05))


def _save_optimizer(opt, path: Path) -> None:
    """AdamW's state as safetensors (no pickle): state.{param index}.{name} tensors."""
    from safetensors.torch import save_file

    sd = opt.state_dict()
    tensors = {f"state.{i}.{k}": v.detach().cpu().contiguous() for i, st in sd["state"].items() for k, v in st.items()}
    with atomic_file(path, suffix=".safetensors") as tmp:
        save_file(tensors, str(tmp), metadata={"format": FORMAT + ".optimizer"})


#: the AdamW state of one parameter, as `_save_optimizer` writes it
_ADAM_STATE = ("exp_avg", "exp_avg_sq", "step")


def _read_optimizer(opt, path: Path, step: int) -> dict:
    """AdamW's state saved at `path` for `opt`'s parameters after `step` steps, validated in full (names,
    shapes, dtypes, finiteness, step counts); a CheckpointError naming the file otherwise."""
    from safetensors import safe_open

    from .paths import utf8_name

    try:
        with utf8_name(path) as name, safe_open(name, framework="pt") as f:
            if (f.metadata() or {}).get("format") != FORMAT + ".optimizer":
                raise ValueError("not an instability optimizer file")
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as exc:  # noqa: BLE001 - missing, truncated or foreign: safetensors has its own types
        raise CheckpointError(f"{path}: unreadable optimizer state ({' '.join(str(exc).split())[:160]})") from None
    params = [p for g in opt.param_groups for p in g["params"]]
    state: dict = {}
    try:
        for key, t in tensors.items():
            kind, i, name = key.split(".", 2)
            if kind != "state" or not i.isdigit() or int(i) >= len(params) or name not in _ADAM_STATE:
                raise ValueError(f"unknown tensor {key!r}")
            state.setdefault(int(i), {})[name] = t
        for i, st in state.items():
            p = params[i]
            if set(st) != set(_ADAM_STATE):
                raise ValueError(f"parameter {i} lacks {', '.join(sorted(set(_ADAM_STATE) - set(st)))}")
            for name in ("exp_avg", "exp_avg_sq"):
                t = st[name]
                if t.shape != p.shape or t.dtype != p.dtype or not bool(torch.isfinite(t).all()):
                    raise ValueError(f"parameter {i}'s {name} is {t.dtype} {tuple(t.shape)} (or not finite), "
                                     f"the parameter {p.dtype} {tuple(p.shape)}")
            if bool((st["exp_avg_sq"] < 0).any()):
                raise ValueError(f"parameter {i}'s exp_avg_sq is negative")
            n = st["step"]
            if n.numel() != 1 or not n.is_floating_point() or not (1 <= float(n) <= step and float(n) == int(n)):
                raise ValueError(f"parameter {i}'s step count {n.tolist()} is not a whole number in [1, {step}]")
    except ValueError as exc:
        raise CheckpointError(f"{path}: damaged optimizer state ({exc})") from None
    if step and not state:
        raise CheckpointError(f"{path}: damaged optimizer state (no state after {step} steps)")
    return state


def _load_optimizer(opt, path: Path, step: int) -> None:
    sd = opt.state_dict()
    sd["state"] = _read_optimizer(opt, path, step)
    opt.load_state_dict(sd)  # moves the tensors to the parameters' device


def _load_parent(out: Path, k: int, device, hp: dict):
    """(model, optimizer) of the parent's unit at step `k`, or None when it is missing or damaged (its
    model or its optimizer state: a damaged one is warned about, and the unit trained again)."""
    import warnings

    unit = _parent_unit(out, k)
    model = _load_unit(unit, device)
    if model is None:
        return None
    opt = _new_optimizer(model, hp)
    try:
        _load_optimizer(opt, unit / OPTIMIZER_FILE, k)
    except CheckpointError as exc:
        warnings.warn(f"{exc}; training the parent's step {k} again", stacklevel=3)
        return None
    return model, opt


# ---------------------------------------------------------------- units on disk
def _load_unit(path: Path, device):
    """The model saved at `path` (on `device`), or None when the unit is not there (or is unreadable:
    an interrupted write is simply redone)."""
    from .io import load_model

    if not (path / "config.json").is_file():
        return None
    try:
        return load_model(path, device=device)
    except (CheckpointError, OSError):
        return None


def _parent_unit(out: Path, k: int) -> Path:
    return out / "parent" / f"step{k}"


def _child_unit(out: Path, k: int, c: int) -> Path:
    return out / "children" / f"spawn{k}" / f"copy{c}"


def _settings(r, total: int, seed: int) -> dict:
    train_ds, _ = r.datasets()
    hp = {k: v for k, v in r.hparams.items() if k not in ("steps", "epochs")}
    return {"format": FORMAT, "recipe": r.name, "model_config": dataclasses.asdict(r.model_config), "hparams": hp,
            "batch_size": r.batch_size, "steps": total, "seed": seed, "train_examples": len(train_ds),
            "train_data": getattr(train_ds, "name", type(train_ds).__name__)}


def _check_settings(out: Path, settings: dict) -> None:
    path = out / "settings.json"
    if path.is_file():
        try:
            old = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            old = None
        if not isinstance(old, dict):
            raise ValueError(f"{path} is not a settings file of an instability run: use another output folder")
        for key, value in settings.items():
            if json.loads(json.dumps(value)) != old.get(key):
                raise ValueError(f"{out} holds an instability run with other settings ({key}: {old.get(key)!r} there, "
                                 f"{value!r} now): use another output folder")
        return
    write_json(path, settings)


# ---------------------------------------------------------------- measuring
def _pair_row(a, b, test, lambdas, methods) -> dict:
    from .match.align import align_with
    from .match.methods import method as registry_entry
    from .sweep import barrier

    row = {}
    for method in methods:
        al = align_with(method, a, b)  # None for "none"
        res = barrier(a, b if al is None else al.apply(b), test, lambdas=lambdas, space=registry_entry(method).space)
        mid = min(range(len(res.lambdas)), key=lambda i: abs(res.lambdas[i] - 0.5))
        row[method] = {"barrier": res.barrier, "acc_barrier": res.acc_barrier, "loss_mid": res.loss[mid],
                       "acc_mid": res.acc[mid], "loss_a": res.loss_a, "loss_b": res.loss_b, "acc_a": res.acc_a,
                       "acc_b": res.acc_b, "lambdas": res.lambdas, "loss": res.loss, "acc": res.acc}
    return row


def _summary(rows, spawn_steps, methods) -> list[dict]:
    out = []
    for k in spawn_steps:
        mine = [r for r in rows if r["spawn_step"] == k]
        entry = {"spawn_step": k, "pairs": len(mine)}
        for m in methods:
            vals = [r[m]["barrier"] for r in mine]
            entry[m] = {"mean": float(np.mean(vals)), "min": float(min(vals)), "max": float(max(vals)),
                        "acc_mean": float(np.mean([r[m]["acc_barrier"] for r in mine]))}
        out.append(entry)
    return out




# ---------------------------------------------------------------- the analysis
def instability(recipe="gpt2-shakespeare", out="instability", *, spawn_steps=(0, 50, 100, 200), copies: int = 2,
                steps: int | None = None, seed: int = 0, lambdas=11, eval_batches: int | None = 4,
                methods=("none", "weight"), device=None, json_path=None, plot_path=None, log=None) -> dict:
    """Run (or resume) the analysis; returns the result written to `json_path` (default
    out/instability.json), also plotted to `plot_path` (default out/instability.png).

    recipe: a name in `lmc_fast.recipes.NAMES` or a Recipe. steps: the total training length
    (default: the recipe's). spawn_steps: ints in [0, steps). copies: children per spawn step
    (>= 2; every pair is measured). eval_batches: test batches (of the recipe's eval batch
    size) per barrier, None for the whole test split. methods: among "none", "permutation",
    "weight". log(msg): progress lines.
    """
    from .data.loader import Loader
    from .io import save_model

    say = log or (lambda msg: None)
    r = _recipe(recipe)
    total = _int("steps", steps, 1) if steps is not None else total_steps(r)
    spawn = check_spawn_steps(spawn_steps, total)
    copies = _int("copies", copies, 2)
    seed = _int("seed", seed, 0)
    if eval_batches is not None:
        eval_batches = _int("eval_batches", eval_batches, 1)
    methods = tuple(methods)
    bad = [m for m in methods if m not in METHODS]
    if bad or not methods:
        raise ValueError(f"methods must be among {METHODS}, got {list(methods)}")
    from .sweep.barrier import lambda_grid

    lambda_grid(lambdas)  # refuse a bad grid before hours of training
    device = torch.device(device) if device is not None else torch.device("cpu")
    out = Path(out)
    settings = _settings(r, total, seed)
    _check_settings(out, settings)
    hp = settings["hparams"]
    train_ds, test_ds = r.datasets()
    t_start = time.perf_counter()
    counts = {"trained": 0, "reused": 0}
    seconds = {"parent": 0.0, "children": 0.0, "measure": 0.0}

    # ---- the parent, from its initialisation through every spawn step (units on disk)
    parent_stream = _Stream(train_ds, r.batch_size, seed, 0)
    parents = {}  # step -> (model, optimizer) of each parent unit found whole
    for i, k in enumerate(spawn):
        found = _load_parent(out, k, device, hp)
        if found is not None:
            parents[k] = found
            counts["reused"] += 1
            continue
        done = [j for j in spawn[:i] if j in parents]
        start = done[-1] if done else 0
        if done:
            model, opt = _load_parent(out, start, device, hp)  # a fresh copy: the kept one stays as saved
        else:
            model = r.model(seed).to(device)
            opt = _new_optimizer(model, hp)
        say(f"parent: steps {start} -> {k}" if k else "parent: initialisation (step 0)")
        t0 = time.perf_counter()
        _train_segment(model, opt, parent_stream, start, k, total, hp, device)
        seconds["parent"] += time.perf_counter() - t0
        unit = _parent_unit(out, k)
        _save_optimizer(opt, unit / OPTIMIZER_FILE)  # before the model: a loadable model means a complete unit
        save_model(model, unit, metadata={"kind": "instability-parent", "step": k, "seed": seed, "recipe": r.name})
        parents[k] = True
        counts["trained"] += 1

    # ---- the children: fork at k, train to the end on their own data order
    for k in spawn:
        for c in range(copies):
            unit = _child_unit(out, k, c)
            if _load_unit(unit, device) is not None:
                counts["reused"] += 1
                continue
            model = _load_unit(_parent_unit(out, k), device)
            opt = _new_optimizer(model, hp)
            _load_optimizer(opt, _parent_unit(out, k) / OPTIMIZER_FILE, k)
            say(f"spawn step {k}, copy {c}: steps {k} -> {total}")
            t0 = time.perf_counter()
            losses = _train_segment(model, opt, _Stream(train_ds, r.batch_size, seed, 1 + c), k, total, total, hp,
                                    device)
            seconds["children"] += time.perf_counter() - t0
            tail = losses[-100:]
            save_model(model, unit, metadata={"kind": "instability-child", "spawn_step": k, "copy": c, "steps": total,
                                              "seed": seed, "recipe": r.name,
                                              "train_loss": float(np.mean(tail)) if tail else None})
            counts["trained"] += 1

    # ---- barriers of every pair of children
    test = list(Loader(test_ds, r.eval_batch_size))
    test = test if eval_batches is None else test[:eval_batches]
    lams = lambda_grid(lambdas)
    rows = []
    t0 = time.perf_counter()
    for k in spawn:
        children = [_load_unit(_child_unit(out, k, c), device) for c in range(copies)]
        for i, j in itertools.combinations(range(copies), 2):
            row = {"spawn_step": k, "copies": [i, j], **_pair_row(children[i], children[j], test, lams, methods)}
            rows.append(row)
            say(f"spawn step {k}, copies {i}-{j}: " + ", ".join(f"{m} {row[m]['barrier']:.4f}" for m in methods))
    seconds["measure"] = time.perf_counter() - t0

    result = {"kind": "instability", **settings, "spawn_steps": spawn, "copies": copies, "methods": list(methods),
              "lambdas": lams, "eval_batches": eval_batches, "eval_examples": sum(len(x) for x, _ in test),
              "rows": rows, "summary": _summary(rows, spawn, methods), "units": counts,
              "seconds": {**seconds, "total": time.perf_counter() - t_start}, "machine": machine_info(device),
              "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds")}
    json_path = Path(json_path) if json_path is not None else out / "instability.json"
    plot_path = Path(plot_path) if plot_path is not None else out / "instability.png"
    write_json(json_path, result)
    plot_instability(result, plot_path)
    result["json_path"], result["plot_path"] = str(json_path), str(plot_path)
    return result


def plot_instability(result: dict, path) -> Path:
    """Loss and accuracy barrier of every pair of children against the spawn step, per method (mean joined)."""
    from .plots import _COLOURS, _plt, _save

    plt = _plt()
    fig, (ax_l, ax_a) = plt.subplots(1, 2, figsize=(10, 4), dpi=120)
    ks = result["spawn_steps"]
    for i, m in enumerate(result["methods"]):
        colour = _COLOURS.get(m, f"C{i}")
        for ax, key, scale in ((ax_l, "barrier", 1.0), (ax_a, "acc_barrier", 100.0)):
            xs = [row["spawn_step"] for row in result["rows"]]
            ys = [scale * row[m][key] for row in result["rows"]]
            ax.scatter(xs, ys, color=colour, alpha=0.5, s=18)
            means = [scale * float(np.mean([row[m][key] for row in result["rows"] if row["spawn_step"] == k]))
                     for k in ks]
            ax.plot(ks, means, "-o", color=colour, label=m if m != "none" else "none (raw)")
    ax_l.set_ylabel("loss barrier")
    ax_a.set_ylabel("accuracy barrier (%)")
    for ax in (ax_l, ax_a):
        ax.set_xticks(ks)
        ax.set_xlabel("spawn step k")
        ax.grid(alpha=0.3)
        ax.axhline(0.0, color="black", lw=0.6)
    ax_l.legend()
    fig.suptitle(f"{result['recipe']}: barrier between copies spawned at step k and trained to step "
                 f"{result['steps']} ({result['copies']} copies)")
    fig.tight_layout()
    try:
        return _save(fig, path)
    finally:
        plt.close(fig)


def format_table(result: dict) -> str:
    """spawn step | copies | barrier per method (loss; accuracy in %), as Markdown."""
    methods = result["methods"]
    head = ["spawn step", "copies"] + [f"{m} loss" for m in methods] + [f"{m} acc" for m in methods]
    body = [[str(r["spawn_step"]), f"{r['copies'][0]}-{r['copies'][1]}"]
            + [f"{r[m]['barrier']:.4f}" for m in methods] + [f"{100 * r[m]['acc_barrier']:.2f}%" for m in methods]
            for r in result["rows"]]
    widths = [max(len(c) for c in col) for col in zip(head, *body)]
    line = lambda cells: "| " + " | ".join(c.rjust(w) for c, w in zip(cells, widths)) + " |"
    sep = "|" + "|".join("-" * (w + 1) + ":" for w in widths) + "|"
    return "\n".join([line(head), sep] + [line(b) for b in body])


__all__ = ["METHODS", "check_spawn_steps", "format_table", "instability", "plot_instability", "total_steps"]
