"""Learned matching: optimise the alignment itself on the task loss of interpolated models.

One latent matrix per symmetry group, initialised at the weight-matching solution; each
step projects the latents to group elements (straight-through, see projection.py), forms
theta = sum_n w_n g_n . theta_n for mixing weights w drawn per step (for two models lambda ~
U[0.4, 0.6] or U[0, 1] by preset, Dirichlet(alpha) for several), and takes an Adam step on the
latents only. Several mixing weights share a step as one batched pass (the K axis of the
functional forward). Early stopping on the barrier measured on a validation split carved
from the training batches; the best projected elements are returned as ordinary Alignments.
"""
from __future__ import annotations

import math
import time

import torch

from ..models import functional as Fn
from ..sweep.batches import reiterable
from ..sweep.checks import check_batch, spec_from_params
from ..sweep.evaluate import EvalOptions, evaluate_mixtures
from ..sweep.metrics import has_kept_targets, task_loss, task_of
from ..numerics import dirichlet_weights
from ..sweep.simplex import check_alpha
from ..symmetry import Alignment
from . import learned_checkpoint
from .options import LAMBDA_MODES, PRESET_NAMES, TARGETS, check_option, check_options
from .learned_module import LEARN_MODES, LearnedAlignment, MixedAlignments, exact_alignment, moved_from
from .learned_module import mix as _mix  # noqa: F401 - the old private name
from .learned_targets import EndpointTargets, soft_cross_entropy



def sample_weights(mode, n_models: int, k: int, gen: torch.Generator, alpha: float = 1.0) -> torch.Tensor:
    """(k, n_models) mixing weights for one step."""
    if n_models > 2:
        return dirichlet_weights(k, n_models, float(alpha), gen)
    if isinstance(mode, (int, float)):
        lam = torch.full((k,), float(mode), dtype=torch.float64)
    elif mode == "narrow":
        lam = 0.4 + 0.2 * torch.rand(k, generator=gen, dtype=torch.float64)
    elif mode == "uniform":
        lam = torch.rand(k, generator=gen, dtype=torch.float64)
    elif mode == "mixed":
        # narrow's weight near the midpoint, where the barrier peaks, without leaving lambda < 0.4 or > 0.6
        # untrained: narrow alone broke 2 of 5 digits paths whose loss peaked at lambda 0.3
        near = torch.rand(k, generator=gen, dtype=torch.float64) < 0.5
        lam = torch.where(near, 0.4 + 0.2 * torch.rand(k, generator=gen, dtype=torch.float64),
                          torch.rand(k, generator=gen, dtype=torch.float64))
    elif mode == "fixed":
        lam = torch.full((k,), 0.5, dtype=torch.float64)
    else:
        raise ValueError(f"lam must be one of {LAMBDA_MODES} or a number, got {mode!r}")
    return torch.stack([1 - lam, lam], dim=1)


def split_batches(data, val_fraction: float):
    check_option("val_fraction", val_fraction)
    batches = list(reiterable(data))
    if len(batches) < 2:
        raise ValueError("learned matching needs at least 2 batches (training and a validation split)")
    # at least one batch on each side, whatever the fraction rounds to
    n_val = min(max(1, int(round(len(batches) * val_fraction))), len(batches) - 1)
    return batches[:-n_val], batches[-n_val:]


def _val_barrier(arch, params_list, mixes, val, own_losses, options: EvalOptions) -> float:
    rows = evaluate_mixtures(arch, params_list, mixes, val, options)
    return max(r["loss"] - float(torch.tensor(w, dtype=torch.float64) @ own_losses) for r, w in zip(rows, mixes))




def learn_alignments(spec, params_list, init_elements, train, val, *, steps=1000, lr=3e-3, lam="narrow",
                     alpha=1.0, lambdas_per_step=4, eval_every=50, patience=6, seed=0, dtype=torch.float32,
                     device="cpu", learn="all", sides="b", target="labels", temperature=1.0, augment=None,
                     progress=False, checkpoint=None, checkpoint_every=None):
    """Core loop on parameters: params_list[0] is the reference (fixed, or moving too with sides="both");
    latents for every other model.
    Returns (best hard elements per model after the first, info); see `fit_alignments`."""
    if learn not in LEARN_MODES:
        raise ValueError(f"learn must be one of {LEARN_MODES}, got {learn!r}")
    _check_target(target, augment)
    module = MixedAlignments(spec, params_list, init_elements, dtype=dtype, device=device, learn=learn, sides=sides)
    return fit_alignments(module, train, val, steps=steps, lr=lr, lam=lam, alpha=alpha,
                          lambdas_per_step=lambdas_per_step, eval_every=eval_every, patience=patience, seed=seed,
                          target=target, temperature=temperature, augment=augment, progress=progress,
                          checkpoint=checkpoint, checkpoint_every=checkpoint_every)


def _check_target(target: str, augment) -> None:
    if target not in TARGETS:
        raise ValueError(f"target must be one of {TARGETS}, got {target!r}")
    if target == "labels" and not getattr(augment, "label_preserving", True):
        raise ValueError(f"augment={augment!r} changes what the labels describe; use target='endpoints' with it")


#: the validation barrier must fall by more than this to count as an improvement (early stopping)
IMPROVEMENT = 1e-6


def _check_checkpointing(checkpoint, every, eval_every) -> int | None:
    if checkpoint is None:
        if every is not None:
            raise ValueError("checkpoint_every needs checkpoint=PATH")
        return None
    every = eval_every if every is None else every
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ValueError(f"checkpoint_every must be a whole number >= 1, got {every!r}")
    learned_checkpoint.check_path(checkpoint)  # something else at the path: refused before any work
    return every


def _lr_factor(step: int, steps: int, warmup: float) -> float:
    """Linear warm-up over the first `warmup` fraction of the steps, then cosine decay to zero."""
    w = int(round(warmup * steps))
    if step < w:
        return (step + 1) / w
    return 0.5 * (1 + math.cos(math.pi * min(step - w, steps - w) / max(steps - w, 1)))


def _check_loop_options(**options) -> None:
    """The loop's settings, each by its one rule (options.py), before any work; None is not a value here."""
    for name, value in options.items():
        if value is None and name not in ("clip", "checkpoint_every"):
            raise ValueError(f"{name} must be given (None is only a preset's placeholder)")
        check_option(name, value)


def fit_alignments(module: MixedAlignments, train, val, *, steps=1000, lr=3e-3, lam="narrow", alpha=1.0,
                   lambdas_per_step=4, eval_every=50, patience=6, seed=0, target="labels", temperature=1.0,
                   augment=None, weight_decay=0.0, warmup=0.0, clip=None, progress=False, checkpoint=None,
                   checkpoint_every=None):
    """The learned-matching loop over a `MixedAlignments` (e.g. a `LearnedAlignment`): Adam (AdamW
    with `weight_decay` > 0) on the latents that require grad, cosine schedule after a linear
    `warmup` (a fraction of the steps), gradients clipped to norm `clip` (None: not clipped),
    early stopping on the validation barrier; the best validation state is returned.

    target="labels": the task loss of each mixture. target="endpoints": cross-entropy against
    the same mixture of the end models' predictive distributions (a distillation target, which
    still carries signal where the end models fit the training labels perfectly, and needs
    no labels on augmented inputs). augment(x, generator) -> x transforms each training batch.
    checkpoint=PATH saves the loop's whole state there every `checkpoint_every` steps (default:
    every `eval_every`), and a run started with the same inputs resumes from it, ending exactly
    where an uninterrupted run would (learned_checkpoint.py).
    Returns (best hard elements per model after the first, info).
    """
    _check_target(target, augment)
    _check_loop_options(steps=steps, lr=lr, lam=lam, lambdas_per_step=lambdas_per_step, eval_every=eval_every,
                        patience=patience, seed=seed, temperature=temperature, weight_decay=weight_decay,
                        warmup=warmup, clip=clip, checkpoint_every=checkpoint_every)
    checkpoint_every = _check_checkpointing(checkpoint, checkpoint_every, eval_every)
    spec, arch, params_list, learn = module.spec, module.arch, module.params_list, module.learn
    N = module.n_models
    if N > 2:
        alpha = check_alpha(alpha)
    if task_of(arch) == "denoise" and (target != "labels" or augment is not None):
        raise ValueError("a DiT's learned matching learns on its own task, the noise (target 'labels', no "
                         "augmentation): the end-model target scores class probabilities, Mixup blends the timestep planes")
    inputs = spec_from_params(arch, params_list[0])
    for x, y in list(train) + list(val):  # every batch once, before any work: one line for a bad one
        check_batch(inputs, x, y)
    n_train = len(list(train))
    t0 = time.perf_counter()
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    fixed = module.fixed_params()
    first = next(iter(fixed[0].values()))
    dtype, device = first.dtype, first.device
    # the end models' distributions, kept per training batch when the batches come back unchanged
    fixed_batches = augment is None and isinstance(train, (list, tuple))
    targets = EndpointTargets(arch, Fn.stack(fixed), temperature, keep=fixed_batches) if target == "endpoints" else None
    params = [p for p in module.parameters() if p.requires_grad]
    opt = (torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay) if weight_decay > 0
           else torch.optim.Adam(params, lr=lr))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: _lr_factor(s, steps, warmup))
    mixes = [[1.0 - l, l] for l in (0.25, 0.5, 0.75)] if N == 2 else [[1.0 / N] * N]
    evals = EvalOptions(dtype=dtype, device=device)  # the validation sweeps: local, the module's dtype and device
    own = torch.tensor([r["loss"] for r in evaluate_mixtures(arch, params_list, torch.eye(N, dtype=torch.float64),
                                                             val, evals)], dtype=torch.float64)

    def hard_params():
        hard = module.hard_elements()
        aligned = [params_list[0]] + [Alignment(spec, h).apply_params(p) for h, p in zip(hard, params_list[1:])]
        return hard, aligned

    key = None
    if checkpoint is not None:  # before any step: the key covers the initial latents
        options = {"steps": steps, "lr": lr, "lam": lam, "alpha": alpha, "lambdas_per_step": lambdas_per_step,
                   "eval_every": eval_every, "patience": patience, "seed": seed, "target": target,
                   "temperature": temperature, "augment": None if augment is None else repr(augment)}
        if weight_decay or warmup or clip is not None:  # (absent at their defaults: older checkpoints still resume)
            options.update(weight_decay=weight_decay, warmup=warmup, clip=clip)
        key = learned_checkpoint.input_key(module, train, val, options)
    limits = {"steps": steps, "every": checkpoint_every, "eval_every": eval_every, "patience": patience,
              "n_train": n_train, "eps": IMPROVEMENT}
    resumed = None if checkpoint is None else learned_checkpoint.load(checkpoint, key, module, opt, sched, gen, limits)
    if resumed is None:
        hard, aligned = hard_params()
        best = (_val_barrier(arch, aligned, mixes, val, own, evals), 0, hard)
        history = [(0, best[0])]
        bad, start, pos = 0, 0, 0
    else:
        best, history = resumed["best"], resumed["history"]
        bad, start, pos = resumed["bad"], resumed["step"], resumed["pos"]
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=steps, initial=start, desc="learned matching")
    # pos: batches taken from the current pass over `train`, so a resumed run continues at the same batch
    step, batch_iter = start, iter(train)
    for _ in range(pos):
        next(batch_iter)
    for step in range(start + 1, steps + 1):
        try:
            x, y = next(batch_iter)
        except StopIteration:
            batch_iter, pos = iter(train), 0
            x, y = next(batch_iter)
        pos += 1
        batch = x  # the tensor as `train` holds it: what a kept end-model target is checked against
        x = x.to(device=device, dtype=dtype) if x.is_floating_point() else x.to(device)
        y = y.to(device)
        if augment is not None:
            x = augment(x, gen)
        w = sample_weights(lam, N, lambdas_per_step, gen, alpha).to(device=device, dtype=dtype)
        logits = module.mixture_logits(x, w)
        # a batch whose every label is the ignore index (-100) teaches nothing: no Adam step
        # (a zero gradient would still move the latents through Adam's momentum)
        task = task_of(arch)  # (BERT's masked tokens are not shifted; DiT's noise is scored by squared error)
        learns = target != "labels" or task == "denoise" or has_kept_targets(logits[0], y, task)
        if target == "labels":
            loss = sum(task_loss(logits[i], y, task=task) for i in range(logits.shape[0])) / logits.shape[0]
        else:
            # Softened by a temperature (T^2 keeps the gradient scale, as in distillation):
            # the end models fit the training images almost perfectly, so at T = 1 their
            # targets are nearly one-hot and carry little more than the labels.
            T = temperature
            soft = targets.mixed(pos - 1, batch, x, w)
            loss = sum(soft_cross_entropy(logits[i] / T, soft[i]) for i in range(logits.shape[0])) * T * T / logits.shape[0]
        if learns:
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(params, clip)
            opt.step()
        sched.step()
        stop = False
        if step % eval_every == 0 or step == steps:
            hard, aligned = hard_params()
            vb = _val_barrier(arch, aligned, mixes, val, own, evals)
            history.append((step, vb))
            if vb < best[0] - IMPROVEMENT:
                best, bad = (vb, step, hard), 0
            else:
                bad += 1
                stop = bad >= patience
        if bar is not None:  # after the evaluation: the bar shows the best value kept so far
            bar.update(1)
            bar.set_postfix(loss=f"{loss.item():.4f}", best_val_barrier=f"{best[0]:.4f}")
        if stop:
            break
        if checkpoint is not None and step % checkpoint_every == 0 and step < steps:
            learned_checkpoint.save(checkpoint, key, module, opt, sched, gen,
                                    {"step": step, "pos": pos, "bad": bad, "best": best, "history": history})
    if bar is not None:
        bar.close()
    seconds = time.perf_counter() - t0
    info = {"method": "learned", "steps": step, "best_step": best[1], "val_barrier": best[0],
            "val_history": history, "seconds": seconds, "steps_per_second": step / seconds,
            "lam": lam, "lambdas_per_step": lambdas_per_step, "lr": lr, "learn": learn, "sides": module.sides,
            "target": target,
            "weight_decay": weight_decay, "warmup": warmup, "clip": clip,
            "temperature": temperature, "targets_reused": 0 if targets is None else targets.hits,
            "augment": None if augment is None else repr(augment)}
    return best[2], info


#: Learned matching's settings by preset; a keyword given explicitly overrides its preset's value.
#: "paper": the paper's recipe (task loss, lambda ~ U[0.4, 0.6], lr 3e-3, 4 lambdas a step);
#: "distill": end-model targets on the training inputs as they are, lambda ~ U[0, 1], lr 1e-2, 20% validation.
#: (Mixup blends, its first recipe, were higher on every Fashion-MNIST ViT pair at 300 steps and on 7 of 10
#: digits pairs at 1000 (medians 0.039 vs 0.030), and 20% slower: bench/results/learned_settings.md.)
#: "labels": distill's settings with the task loss as target.
#: "labels-loop" / "distill-loop": those with the paper authors' training loop: one lambda a step at twice the
#: steps (about the same seconds: a step's cost is its forward and backward passes), AdamW weight decay 0.01,
#: 5% of the steps of warm-up, gradients clipped to norm 1. Lower than all three others on most Table 1 pairs
#: at equal cost (bench/results/preset_rules.md).
#: distill-loop, the preset of memorised end models, at lr 3e-2: on the digits ViTs lower than at 1e-2 on 12 of
#: 15 runs of a pair over two sets of models, 1 tied (600 steps: medians 0.049 vs 0.070 on both instruction sets
#: and 0.025 vs 0.052; 2000 steps: 0.007 vs 0.023). labels-loop keeps 1e-2: 3e-2 was lower on the Fashion-MNIST
#: ViTs and the NeoXs but higher on the LLaMAs (3 of 5) and the BERTs (5 of 5) (bench/results/learned_budget_loop.md).
#: "default" picks one of them from the data (`default_preset`).
_DISTILL = dict(steps=1000, lr=1e-2, lam="uniform", lambdas_per_step=2, val_fraction=0.2, eval_every=100,
                patience=6, target="endpoints", augment=None, weight_decay=0.0, warmup=0.0, clip=None)
_AUTHORS_LOOP = dict(steps=2000, lambdas_per_step=1, eval_every=200, weight_decay=0.01, warmup=0.05, clip=1.0)
PRESETS = {
    "paper": dict(steps=1000, lr=3e-3, lam="narrow", lambdas_per_step=4, val_fraction=0.1, eval_every=50,
                  patience=6, target="labels", augment=None, weight_decay=0.0, warmup=0.0, clip=None),
    "distill": _DISTILL,
    "labels": {**_DISTILL, "target": "labels"},
    "distill-loop": {**_DISTILL, **_AUTHORS_LOOP, "lr": 3e-2},
    "labels-loop": {**_DISTILL, **_AUTHORS_LOOP, "target": "labels"},
}
assert set(PRESET_NAMES) == {"default", *PRESETS}  # options.py names them for the checks
#: End models whose mean training loss is below this have memorised their training data, and "distill-loop"
#: fits the end models' predictions; elsewhere "labels-loop" fits the labels. Over the 30 pairs of six settings
#: (bench/results/preset_rules.md; 600 one-lambda steps against 300 two-lambda ones) this rule is within 0.0059
#: (9%) of the lowest of the five presets on every pair (mean 0.0008) and loses 8; the former rule (distill /
#: labels) lost up to 0.042. labels-loop is lower than labels on 24 of 30 (median 0.84x); on the memorised
#: digits ViTs distill-loop and labels-loop tie (medians 0.0518 and 0.0519).
MEMORISED_LOSS = 0.05


def end_models_training_loss(model_a, model_b, data, max_batches: int = 8) -> float:
    """The larger of the two end models' mean task loss on (up to `max_batches` of) the matching batches."""
    from ..sweep.metrics import evaluate

    return max(evaluate(m, data, max_batches=max_batches)["loss"] for m in (model_a, model_b))


def default_preset(training_loss: float) -> str:
    """"distill-loop" when the end models have memorised their training batches, else "labels-loop"."""
    return "distill-loop" if training_loss < MEMORISED_LOSS else "labels-loop"


def preset_settings(preset: str, **given) -> dict:
    """The preset's settings with every non-None keyword of `given` in its place."""
    if preset not in PRESETS:
        raise ValueError(f"preset must be one of {PRESET_NAMES}, got {preset!r}")
    unknown = sorted(set(given) - set(PRESETS[preset]))
    if unknown:
        raise ValueError(f"not a learned-matching setting: {unknown}")
    return {**PRESETS[preset], **{k: v for k, v in given.items() if v is not None}}


def resolved_settings(options: dict) -> dict:
    """The settings learned matching runs with under `options` (a grid column's), for each preset they may
    resolve to: "default" depends on the data, so every preset its rule can pick (denoisers: "paper"), and the
    threshold it reads. A stored result is reused only while these are unchanged, so a changed preset or rule
    recomputes the columns that relied on it and no other."""
    preset = options.get("preset", "default")
    given = {k: options[k] for k in PRESETS["paper"] if k in options}
    if preset != "default":
        return {preset: preset_settings(preset, **given)}
    candidates = sorted({default_preset(0.0), default_preset(float("inf")), "paper"})
    return {"memorised_loss": MEMORISED_LOSS, **{p: preset_settings(p, **given) for p in candidates}}


def _denoises(model) -> bool:
    from ..models.adapters import adapter_for

    return task_of(adapter_for(model).arch(model)) == "denoise"


def _token_inputs(batches) -> bool:
    """Whether the batches hold token ids (a language model's inputs), not images."""
    x = batches[0][0] if batches else None
    return isinstance(x, torch.Tensor) and not x.is_floating_point() and not x.is_complex() and x.dtype != torch.bool


def _check_augment(augment, target: str | None, placeholder: bool = False) -> None:
    """An augmentation `auto_augment` takes and, where the target is known (None: the preset's
    evaluation decides it), one that target allows; `placeholder`: "preset" too (learned_matching's)."""
    if isinstance(augment, str):
        if augment not in ("auto", "none") + (("preset",) if placeholder else ()):
            raise ValueError(f"augment must be 'auto', 'none', None or an augmentation object, got {augment!r}")
    elif target is not None:
        _check_target(target, augment)


def auto_augment(augment, target: str, data):
    """augment="auto": Mixup(1.0) for images with the end-model target (labels do not describe
    blended images), nothing for token ids or with target="labels"; "none": nothing; else as given."""
    if isinstance(augment, str):
        _check_augment(augment, None)
        if augment == "none":
            return None
        x = data[0][0] if data else None
        images = isinstance(x, torch.Tensor) and x.is_floating_point() and x.dim() == 4
        if not (images and target == "endpoints"):
            return None
        from ..data.augment import Mixup

        return Mixup(1.0)
    return augment


def learned_matching(model_a, model_b, data, *, preset: str = "default", steps: int | None = None,
                     lr: float | None = None, lam=None, lambdas_per_step: int | None = None,
                     val_fraction: float | None = None, eval_every: int | None = None, patience: int | None = None,
                     head_map: str = "orthogonal", init: Alignment | None = None, learn: str = "all",
                     sides: str = "b", target: str | None = None, temperature: float = 1.0, augment="preset",
                     weight_decay: float | None = None, warmup: float | None = None, clip: float | None = None,
                     seed: int = 0, device=None, progress: bool = False, checkpoint=None,
                     checkpoint_every: int | None = None) -> Alignment:
    """`lf.align(a, b, method="learned", data=...)`: the alignment maps B onto A.

    Settings left unset come from `preset`: "paper", "distill", "labels", "distill-loop", "labels-loop"
    (PRESETS) or "default", which is "distill-loop" when the end models' training loss on `data` is below
    MEMORISED_LOSS (they have memorised it) and "labels-loop" otherwise (denoisers: "paper"). augment: None / "none" (every
    preset's), "auto" (Mixup for images with target "endpoints"), or an object from lmc_fast.data.augment.
    weight_decay (AdamW when > 0), warmup (a fraction of the steps before the cosine decay) and
    clip (the gradients' max norm) are the optimiser's. `init`: the starting alignment (default:
    weight matching; for language models, with the token-frequency prior of `data`, see
    `lf.align(..., token_counts=)`). sides="both": A's elements learn too, from the identity (LMC-DM);
    the alignment returned still maps B onto A. checkpoint=PATH, checkpoint_every=N: resumable, see `fit_alignments`."""
    given = dict(steps=steps, lr=lr, lam=lam, lambdas_per_step=lambdas_per_step, val_fraction=val_fraction,
                 eval_every=eval_every, patience=patience, target=target, weight_decay=weight_decay, warmup=warmup,
                 clip=clip, augment=None if augment == "preset" else augment)
    check_options({k: v for k, v in given.items() if k != "augment"})  # every setting, before any work
    check_options(dict(preset=preset, head_map=head_map, learn=learn, sides=sides, temperature=temperature, seed=seed,
                       checkpoint_every=checkpoint_every))
    # the augmentation against the target, where the target is known before the preset's evaluation
    _check_augment(augment, target if target is not None else PRESETS.get(preset, {}).get("target"), True)
    if checkpoint is not None:  # before the preset's evaluation and the initial matching
        learned_checkpoint.check_path(checkpoint)
    data = list(reiterable(data))
    training_loss = None
    if preset == "default" and _denoises(model_a):
        # "distill" scores class probabilities and DiT learns on its noise; "labels" is not measured on DiTs
        preset = "paper"
    if preset == "default":
        training_loss = end_models_training_loss(model_a, model_b, data)
        preset = default_preset(training_loss)
    o = preset_settings(preset, **given)
    if augment is None:  # an explicit None: no augmentation, whatever the preset says
        o["augment"] = None
    train, val = split_batches(data, o["val_fraction"])
    if learn not in LEARN_MODES:
        raise ValueError(f"learn must be one of {LEARN_MODES}, got {learn!r}")
    o["augment"] = auto_augment(o["augment"], o["target"], train)
    _check_target(o["target"], o["augment"])
    start, start_name = init, None
    if init is None and _token_inputs(train):
        # language models start from weight matching with the token-frequency prior of these batches:
        # lower on each of 4 Shakespeare pairs than the plain start (bench/results/learned_ablation.json)
        from .weight import align_by_weights

        start, start_name = align_by_weights(model_a, model_b, seed=seed, token_counts=train), "weight+token_prior"
    module = LearnedAlignment(model_a, model_b, "weight" if start is None else start, head_map=head_map, learn=learn,
                              sides=sides, device=device, seed=seed)
    hard, info = fit_alignments(module, train, val, steps=o["steps"], lr=o["lr"], lam=o["lam"],
                                lambdas_per_step=o["lambdas_per_step"], eval_every=o["eval_every"],
                                patience=o["patience"], seed=seed, target=o["target"], temperature=temperature,
                                augment=o["augment"], weight_decay=o["weight_decay"], warmup=o["warmup"],
                                clip=o["clip"], progress=progress, checkpoint=checkpoint,
                                checkpoint_every=checkpoint_every)
    info["init"] = start_name or ("weight" if init is None else init.info.get("method", "weight"))
    info["preset"], info["val_fraction"], info["end_models_training_loss"] = preset, o["val_fraction"], training_loss
    al = exact_alignment(module.spec, hard[0], info)
    # the way travelled from the start: the fraction of units reassigned, the maps' relative change
    al.info["moved"] = moved_from(al, Alignment(module.spec, module.init_elements[0]))
    return al
