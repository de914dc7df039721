"""Planted cases: apply a random symmetry to a model, align back, recover it exactly."""
import pytest
import torch

import lmc_fast as lf
from lmc_fast.match.align import params_pair
from lmc_fast.match.weight import weight_matching
from lmc_fast.models.adapters import standard_params
from lmc_fast.symmetry import Alignment, canonical_params, canonical_spec, permutation_spec
from zoo import KINDS, logits, make_inputs, make_model, rel_err


def param_rel_err(m1, m2):
    _, p1 = standard_params(m1)
    _, p2 = standard_params(m2)
    return max(((p1[k] - p2[k]).norm() / p2[k].norm().clamp_min(1e-12)).item() for k in p2)


def planted(kind, spec_fn, seed):
    a = make_model(kind, seed=seed)
    arch, _ = standard_params(a)
    truth = Alignment.random(spec_fn(arch), seed=seed + 1)
    return a, truth.apply(a), truth


@pytest.mark.parametrize("kind", KINDS)
def test_weight_matching_recovers_planted_symmetry(kind):
    a, b, _ = planted(kind, canonical_spec, seed=21)
    x = make_inputs(kind)
    assert param_rel_err(b, lf.to_canonical(a)) > 0.5  # the plant really moved B
    al = lf.align(a, b, "weight")
    aligned = al.apply(b)
    assert param_rel_err(aligned, lf.to_canonical(a)) < 1e-4
    assert rel_err(logits(aligned, x), logits(a, x)) < 1e-5
    assert al.info["iterations"] < 30


@pytest.mark.parametrize("kind", ["vit", "gpt2", "neox", "hf_neox"])
def test_weight_matching_recovers_the_inverse_element(kind):
    a, b, truth = planted(kind, canonical_spec, seed=22)
    al = lf.align(a, b, "weight")
    inv = truth.inverse()
    for name, group in al.spec.groups.items():
        if group.kind == "permutation":
            assert torch.equal(al[name]["perm"], inv[name]["perm"]), name
        elif group.kind == "heads":
            assert torch.equal(al[name]["perm"], inv[name]["perm"]), name
            assert torch.allclose(al[name]["qk"], inv[name]["qk"], atol=1e-6), name
        else:
            assert torch.allclose(al[name]["matrix"], inv[name]["matrix"], atol=1e-6), name


@pytest.mark.parametrize("kind", KINDS)
def test_permutation_method_recovers_planted_permutation(kind):
    a, b, _ = planted(kind, permutation_spec, seed=23)
    al = lf.align(a, b, "permutation")
    assert al.spec.space == "raw"
    aligned = al.apply(b)
    assert param_rel_err(aligned, a) == 0.0  # permutations are exact
    assert rel_err(logits(aligned, make_inputs(kind)), logits(a, make_inputs(kind))) < 1e-12


@pytest.mark.parametrize("kind", ["vit", "gpt2", "hf_gpt2", "llama", "hf_llama", "hf_qwen2", "neox", "hf_neox", "bert", "hf_bert_cls",
                                  "hf_neox_seq"])
@pytest.mark.parametrize("residual_only", [False, True])
def test_activation_matching_recovers_planted_symmetry(kind, residual_only):
    """Full activation statistics, and the residual's alone with weight matching for the rest."""
    a, b, _ = planted(kind, canonical_spec, seed=24)
    data = [(make_inputs(kind, seed=s, batch=16), None) for s in range(4)]
    al = lf.align(a, b, "activation", data=data, residual_only=residual_only)
    aligned = al.apply(b)
    assert param_rel_err(aligned, lf.to_canonical(a)) < 1e-4
    assert rel_err(logits(aligned, make_inputs(kind)), logits(a, make_inputs(kind))) < 1e-5


@pytest.mark.parametrize("order", ["structured", "random"])
@pytest.mark.parametrize("space", ["canonical", "raw"])
def test_objective_never_decreases_on_unrelated_models(order, space):
    a, b = make_model("vit", seed=31), make_model("vit", seed=32)
    arch, ra = standard_params(a)
    _, rb = standard_params(b)
    if space == "canonical":
        spec, pa, pb = canonical_spec(arch), canonical_params(arch, ra), canonical_params(arch, rb)
    else:
        spec, pa, pb = permutation_spec(arch), ra, rb
    _, info = weight_matching(spec, pa, pb, order=order, max_iter=30)
    obj = info["objective"]
    assert len(obj) >= 2
    assert all(y >= x - 1e-9 * abs(x) for x, y in zip(obj, obj[1:])), obj
    assert obj[-1] > info["objective_identity"]


def test_align_rejects_mismatched_models_and_methods():
    with pytest.raises(ValueError, match="model_b does not fit: n_layer"):
        lf.align(make_model("vit", n_layer=2), make_model("vit", n_layer=3))
    with pytest.raises(ValueError, match="method must be one of"):
        lf.align(make_model("vit"), make_model("vit"), "magic")
    with pytest.raises(ValueError, match="data is required"):
        lf.align(make_model("vit"), make_model("vit"), "activation")


def test_weight_matching_planted_with_rank_deficient_anchor():
    """The digits ViT's embeddings (4 pixels a patch) do not pin the residual rotation down
    alone; the frozen-permutation polish must still bring the planted element back."""
    torch.manual_seed(0)
    a = lf.models.ViT(lf.models.ViTConfig.digits()).double()
    arch, _ = standard_params(a)
    b = Alignment.random(canonical_spec(arch), seed=3).apply(a)
    al = lf.align(a, b, "weight")
    assert param_rel_err(al.apply(b), lf.to_canonical(a)) < 1e-6
    assert al.info["polish_iterations"] >= 1


@pytest.mark.parametrize("kind", KINDS)
def test_weight_matching_reports_the_true_objective_after_polish(kind):
    """The polish reads the objective off cached constant parts (everything outside the
    attention blocks is fixed once the permutations are): on two unrelated models it must
    equal sum_p <A_p, (g.B)_p> recomputed from scratch, and never fall below the sweeps'. Post-norm
    models (a permutation of the stream, no rotation to polish) report the sweeps' objective."""
    from lmc_fast.match.align import params_pair
    from lmc_fast.match.solve import objective
    from lmc_fast.symmetry.elements import apply_spec

    spec, pa, pb = params_pair(make_model(kind, seed=1), make_model(kind, seed=2), "canonical")
    elements, info = weight_matching(spec, pa, pb, max_iter=2, tol=0.0, polish_iter=3, polish_tol=0.0)
    assert info["polish_iterations"] == (0 if spec.arch.post_norm else 3)
    truth = objective(pa, apply_spec(spec, pb, elements), list(pa))
    assert abs(info["objective"][-1] - truth) <= 1e-10 * abs(truth)
    assert info["objective"][-1] >= info["objective"][-2] - 1e-10 * abs(truth)


@pytest.mark.parametrize("kind", ["vit", "gpt2"])
@pytest.mark.parametrize("weighting,init", [("per_tensor", "anchor"), ("per_tensor", "identity"),
                                            ("sqrt", "anchor"), ("sum", "anchor_per_tensor"), ("sum", "identity")])
def test_weighting_and_init_options_recover_planted_symmetry(kind, weighting, init):
    """Every weighted term <A_p, g.B_p> / w_p is largest at the planted element (Cauchy-Schwarz,
    the norms are invariant), so every weighting has the same maximiser; each option must find it."""
    a, b, _ = planted(kind, canonical_spec, seed=25)
    spec, pa, pb = params_pair(a, b, "canonical")
    elements, info = weight_matching(spec, pa, pb, weighting=weighting, init=init)
    aligned = Alignment(spec, elements).apply(b)
    assert param_rel_err(aligned, lf.to_canonical(a)) < 1e-4
    assert info["weighting"] == weighting and info["init"] == init
    if weighting == "per_tensor":  # at the plant every nonzero tensor has cosine 1: the objective counts them
        nonzero = sum(1 for n in pa if pa[n].norm() > 0 and pb[n].norm() > 0)
        assert abs(info["objective"][-1] - nonzero) < 1e-6 * nonzero


@pytest.mark.parametrize("kind", ["vit", "gpt2"])
@pytest.mark.parametrize("weighting,power", [("per_tensor", 1.0), ("sqrt", 0.5)])
def test_weighted_objective_equals_a_recomputation(kind, weighting, power):
    """The reported objective is sum_p <A_p, (g.B)_p> / (||A_p|| ||B_p||)^power, recomputed."""
    from lmc_fast.symmetry.elements import apply_spec

    spec, pa, pb = params_pair(make_model(kind, seed=1), make_model(kind, seed=2), "canonical")
    elements, info = weight_matching(spec, pa, pb, weighting=weighting, max_iter=3, tol=0.0, polish_iter=2)
    gb = apply_spec(spec, pb, elements)
    truth = sum(float((pa[n] * gb[n]).sum() / (pa[n].norm() * pb[n].norm()) ** power)
                for n in pa if pa[n].norm() > 0 and pb[n].norm() > 0)
    assert abs(info["objective"][-1] - truth) <= 1e-10 * abs(truth)
    assert info["objective"][-1] > info["objective_identity"]


def test_weighting_and_init_options_are_checked():
    a, b = make_model("vit", seed=1), make_model("vit", seed=2)
    with pytest.raises(ValueError, match="weighting must be one of"):
        lf.align(a, b, "weight", weighting="max")
    with pytest.raises(ValueError, match="weighting is an option of"):
        lf.align(a, b, "activation", data=[(make_inputs("vit"), None)], weighting="per_tensor")
    spec, pa, pb = params_pair(a, b, "canonical")
    with pytest.raises(ValueError, match="init must be"):
        weight_matching(spec, pa, pb, init="random")
    assert lf.align(a, b, "weight", weighting="per_tensor").info["weighting"] == "per_tensor"
    assert lf.align(a, b, "permutation", weighting="per_tensor").info["weighting"] == "per_tensor"


@pytest.mark.parametrize("kind", ["vit", "gpt2"])
@pytest.mark.parametrize("method, spec_fn", [("weight", canonical_spec), ("permutation", permutation_spec)])
def test_float32_matching_recovers_the_planted_element(kind, method, spec_fn):
    """dtype=torch.float32 (half the memory of large models): the same permutations, the continuous maps
    to float32 accuracy, and elements snapped to exact float64 group members."""
    a, b, truth = planted(kind, spec_fn, seed=24)
    al = lf.align(a, b, method, dtype=torch.float32)
    assert al.info["dtype"] == "float32"
    inv = truth.inverse()
    for name in al.spec.groups:
        for key, t in al[name].items():
            assert t.dtype == (torch.int64 if key in ("perm", "qperm") else torch.float64)
            if key in ("perm", "qperm"):
                assert torch.equal(t, inv[name][key]), (name, key)
            else:
                assert (t - inv[name][key]).abs().max() < 1e-4, (name, key)
    al.validate()  # float64 tolerance: exact group elements
    assert rel_err(logits(al.apply(b), make_inputs(kind)), logits(a, make_inputs(kind))) < 1e-4
    with pytest.raises(ValueError, match="dtype must be torch.float32 or torch.float64"):
        lf.align(a, b, method, dtype=torch.float16)


@pytest.mark.parametrize("kind", ["vit", "gpt2", "hf_vit"])
def test_models_without_qkv_biases(kind):
    """q / k / v without biases (HF ViTConfig(qkv_bias=False), our configs' qkv_bias=False): the canonical
    form keeps ln1's shift as a norm bias, and every method recovers a planted symmetry."""
    a = make_model(kind, seed=25, qkv_bias=False)
    arch, raw = standard_params(a)
    assert not arch.qkv_bias and "blocks.0.attn.q.bias" not in raw
    x = make_inputs(kind)
    c = lf.to_canonical(a)
    assert rel_err(logits(c, x), logits(a, x)) < 1e-10
    _, cp = standard_params(c)
    assert cp["blocks.0.ln1.bias"].abs().max() > 0.01  # beta / gamma, nowhere else to go
    for spec_fn, method in ((canonical_spec, "weight"), (permutation_spec, "permutation")):
        truth = Alignment.random(spec_fn(arch), seed=26)
        b = truth.apply(a)
        assert rel_err(logits(b, x), logits(a, x)) < 1e-9
        al = lf.align(a, b, method)
        inv = truth.inverse()
        for name in al.spec.groups:
            if "perm" in inv[name]:
                assert torch.equal(al[name]["perm"], inv[name]["perm"]), (method, name)
        assert rel_err(logits(al.apply(b), x), logits(a, x)) < 1e-9
