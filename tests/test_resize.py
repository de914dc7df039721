"""Width-heterogeneous models: zero-padding the MLP preserves the function, and aligning a
narrower model recovers a planted symmetry plus the units it lacks."""
import pytest
import torch

import lmc_fast as lf
from lmc_fast.models import pad_mlp
from lmc_fast.models.adapters import adapter_for, standard_params
from lmc_fast.symmetry import Alignment, canonical_spec
from lmc_fast.symmetry.spec import permutation_spec
from zoo import KINDS, logits, make_inputs, make_model, rel_err


@pytest.mark.parametrize("kind", KINDS)
def test_pad_mlp_preserves_the_function(kind):
    m = make_model(kind, seed=3)
    arch, _ = standard_params(m)
    wide = pad_mlp(m, arch.d_mlp + 7)
    assert type(wide) is type(m) and standard_params(wide)[0].d_mlp == arch.d_mlp + 7
    x = make_inputs(kind)
    assert rel_err(logits(wide, x), logits(m, x)) < 1e-12
    with pytest.raises(ValueError, match="narrower"):
        pad_mlp(m, arch.d_mlp - 1)


def _drop_mlp_units(model, keep: torch.Tensor):
    """`model` with only the MLP units `keep` (in every layer), as a narrower model."""
    arch, params = standard_params(model)
    out = dict(params)
    for group in permutation_spec(arch).groups.values():
        if group.name.startswith("mlp."):
            for ax in group.axes:
                out[ax.param] = out[ax.param].index_select(ax.axis, keep)
    adapter = adapter_for(model)
    return adapter.build(adapter.resized(model, len(keep)), out)


def _kill_mlp_units(model, dead: torch.Tensor):
    """`model` with the MLP units `dead` zeroed (in and out weights, bias): a width-m model
    that computes what the width-(m - k) model without them computes."""
    arch, params = standard_params(model)
    out = {k: v.clone() for k, v in params.items()}
    for group in permutation_spec(arch).groups.values():
        if group.name.startswith("mlp."):
            for ax in group.axes:
                out[ax.param].index_fill_(ax.axis, dead, 0.0)
    return adapter_for(model).build(model, out)


@pytest.mark.parametrize("kind", ["vit", "gpt2", "hf_gpt2"])
def test_weight_matching_aligns_a_narrower_model(kind):
    """A has k dead MLP units; B is A without them (width m - k) under a random symmetry.
    Aligning B onto A pads B and must bring it back onto A exactly."""
    a_full = make_model(kind, seed=31)
    m = standard_params(a_full)[0].d_mlp
    dead = torch.tensor([1, 4, m - 2])
    keep = torch.tensor([i for i in range(m) if i not in dead.tolist()])
    a = _kill_mlp_units(a_full, dead)
    narrow = _drop_mlp_units(a, keep)
    arch_b = standard_params(narrow)[0]
    b = Alignment.random(canonical_spec(arch_b), seed=32).apply(narrow)
    x = make_inputs(kind)
    assert rel_err(logits(b, x), logits(a, x)) < 1e-9  # same function, different shapes and basis
    al = lf.align(a, b, "weight")
    aligned = al.apply(b)  # pads b, then aligns
    assert standard_params(aligned)[0].d_mlp == m
    _, pa = standard_params(lf.to_canonical(a))
    _, pb = standard_params(aligned)
    assert max(((pa[k] - pb[k]).norm() / pa[k].norm().clamp_min(1e-12)).item() for k in pa) < 1e-4
    res = lf.barrier(a, aligned, [(x, logits(a, x).argmax(-1))], lambdas=3)
    assert abs(res.barrier) < 1e-6


def test_wider_model_b_is_refused_with_a_clear_error():
    a = make_model("vit", seed=41)
    wide = pad_mlp(make_model("vit", seed=42), standard_params(a)[0].d_mlp + 4)
    with pytest.raises(ValueError, match="wider MLP"):
        lf.align(a, wide, "weight")
    al = lf.align(wide, a, "weight")  # the wider model as the reference works
    assert standard_params(al.apply(a))[0].d_mlp == standard_params(wide)[0].d_mlp


def test_merge_many_pads_narrower_models_to_the_widest():
    from lmc_fast.match.learned_merge import learned_merge

    models = [make_model("vit", seed=51, d_mlp=40), make_model("vit", seed=52, d_mlp=48),
              make_model("vit", seed=53, d_mlp=44)]
    x = make_inputs("vit")
    merged = lf.merge_many(models, "weight")
    assert [standard_params(m)[0].d_mlp for m in merged] == [48, 48, 48]
    for m, orig in zip(merged, models):
        assert rel_err(logits(m, x), logits(orig, x)) < 1e-9
    mid = lf.interpolate(merged, [1 / 3] * 3)
    assert standard_params(mid)[0].d_mlp == 48
    data = [(make_inputs("vit", seed=s, batch=8, dtype=torch.float32),
             torch.randint(0, 5, (8,), generator=torch.Generator().manual_seed(s))) for s in range(4)]
    learned, _ = learned_merge([m.float() for m in models], data, steps=2, eval_every=1)
    assert [standard_params(m)[0].d_mlp for m in learned] == [48, 48, 48]
