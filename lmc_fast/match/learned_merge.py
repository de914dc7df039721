"""Learned refinement of MergeMany: N models aligned to one another by training on their mixtures."""
from __future__ import annotations

from ..models.adapters import adapter_for, standard_params
from ..models.resize import widen_all
from ..sweep.simplex import check_alpha
from ..symmetry import check_same_arch, prepare_params
from .learned import learn_alignments, split_batches
from .learned_module import exact_alignment
from .many import merge_many
from .options import check_options


def learned_merge(models, data, *, steps: int = 1000, lr: float = 3e-3, alpha: float = 1.0,
                  lambdas_per_step: int = 4, val_fraction: float = 0.1, eval_every: int = 50, patience: int = 6,
                  target: str = "labels", temperature: float = 1.0, augment=None, seed: int = 0,
                  progress: bool = False):
    """Learned refinement after `merge_many`: latents for models[1:] (models[0] is the
    reference), trained on Dirichlet(alpha) mixtures. Returns (aligned models, alignments)."""
    alpha = check_alpha(alpha)
    check_options(dict(steps=steps, lr=lr, lambdas_per_step=lambdas_per_step, val_fraction=val_fraction,
                       eval_every=eval_every, patience=patience, target=target, temperature=temperature, seed=seed))
    models = widen_all(models)  # narrower MLPs zero-padded, as merge_many does
    merged, alignments = merge_many(models, "weight", return_alignments=True, seed=seed)
    spec = alignments[1].spec
    arch = spec.arch
    params = []
    for m in models:
        a, raw = standard_params(m)
        check_same_arch(arch, a, "model")
        params.append(prepare_params(spec, a, raw))
    train, val = split_batches(data, val_fraction)
    device = next(models[0].parameters()).device
    hard, info = learn_alignments(spec, [alignments[0].apply_params(params[0])] + params[1:],
                                  [al.elements for al in alignments[1:]], train, val, steps=steps, lr=lr,
                                  alpha=alpha, lambdas_per_step=lambdas_per_step, eval_every=eval_every,
                                  patience=patience, seed=seed, device=device, target=target,
                                  temperature=temperature, augment=augment, progress=progress)
    learned = [alignments[0]] + [exact_alignment(spec, h, info) for h in hard]
    out = [merged[0]] + [adapter_for(m).build(m, al.apply_params(p)) for m, al, p in zip(models[1:], learned[1:], params[1:])]
    return out, learned
