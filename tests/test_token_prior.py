"""The token-frequency prior of weight matching (`lf.align(..., "weight", token_counts=...)`)."""
import numpy as np
import pytest
import torch

import lmc_fast as lf
from lmc_fast.match.align import params_pair
from lmc_fast.match.weight import weight_matching
from lmc_fast.models.adapters import standard_params
from lmc_fast.symmetry import Alignment, canonical_spec
from zoo import make_inputs, make_model, same_elements

VOCAB = 37  # zoo's GPT-2 vocabulary


def skewed_counts():
    """Many tokens never occur, the rest with very different frequencies (like bytes in text)."""
    counts = torch.zeros(VOCAB, dtype=torch.int64)
    counts[::3] = torch.arange(1, VOCAB // 3 + 2) ** 2
    return counts


@pytest.mark.parametrize("kind", ["gpt2", "hf_gpt2"])
def test_uniform_counts_give_exactly_the_default_alignment(kind):
    a, b = make_model(kind, seed=1), make_model(kind, seed=2)
    default = lf.align(a, b, "weight")
    for counts in (torch.full((VOCAB,), 5), np.full(VOCAB, 0.25)):
        prior = lf.align(a, b, "weight", token_counts=counts)
        same_elements(default, prior)
        assert prior.info["objective"] == default.info["objective"]
        assert prior.info["token_prior"] and not default.info["token_prior"]


@pytest.mark.parametrize("kind", ["gpt2", "hf_gpt2"])
def test_a_planted_symmetry_is_recovered_with_a_skewed_prior(kind):
    """Each row term w_t <A_t, (g.B)_t> with w_t >= 0 is still largest at the plant."""
    a = make_model(kind, seed=31)
    truth = Alignment.random(canonical_spec(standard_params(a)[0]), seed=32)
    b = truth.apply(a)
    al = lf.align(a, b, "weight", token_counts=skewed_counts())
    _, pa = standard_params(lf.to_canonical(a))
    _, pg = standard_params(al.apply(b))
    assert max(((pg[k] - pa[k]).norm() / pa[k].norm().clamp_min(1e-12)).item() for k in pa) < 1e-4


def test_the_prior_changes_the_objective_to_the_weighted_rows():
    from lmc_fast.symmetry.elements import apply_spec

    spec, pa, pb = params_pair(make_model("gpt2", seed=1), make_model("gpt2", seed=2), "canonical")
    counts = skewed_counts()
    elements, info = weight_matching(spec, pa, pb, token_counts=counts, max_iter=3, tol=0.0, polish_iter=2)
    gb = apply_spec(spec, pb, elements)
    w = counts.double() * VOCAB / counts.sum()
    rows = {"tok_embed.weight", "lm_head.weight"}
    truth = sum(float(((w[:, None] if n in rows else 1.0) * pa[n] * gb[n]).sum()) for n in pa)
    assert abs(info["objective"][-1] - truth) <= 1e-10 * abs(truth)


def test_batches_give_the_same_alignment_as_their_counts():
    a, b = make_model("gpt2", seed=1), make_model("gpt2", seed=2)
    batches = [(make_inputs("gpt2", seed=s), make_inputs("gpt2", seed=s + 10)) for s in range(3)]
    counts = sum(torch.bincount(x.reshape(-1), minlength=VOCAB) for x, _ in batches)
    same_elements(lf.align(a, b, "weight", token_counts=batches), lf.align(a, b, "weight", token_counts=counts))
    same_elements(lf.align(a, b, "weight", token_counts=iter(batches)),
                  lf.align(a, b, "weight", token_counts=counts))


@pytest.mark.parametrize("bad,match", [
    (torch.ones(VOCAB - 1), "length vocab_size=37"),
    (torch.ones(VOCAB, 2), "length vocab_size=37"),
    (-torch.ones(VOCAB), "non-negative"),
    (torch.full((VOCAB,), float("nan")), "finite"),
    (torch.zeros(VOCAB), "not all zero"),
    (3, "counts vector or"),
    ([(torch.rand(2, 3), None)], "integer token-id"),
    ([(torch.tensor([[VOCAB]]), None)], "outside"),
    ([], "empty"),
])
def test_bad_token_counts_are_one_line_errors(bad, match):
    a, b = make_model("gpt2", seed=1), make_model("gpt2", seed=2)
    with pytest.raises(ValueError, match=match) as err:
        lf.align(a, b, "weight", token_counts=bad)
    assert "\n" not in str(err.value)


def test_token_counts_need_a_language_model_and_weight_matching():
    with pytest.raises(ValueError, match="needs a language model"):
        lf.align(make_model("vit", seed=1), make_model("vit", seed=2), "weight", token_counts=torch.ones(5))
    a, b = make_model("gpt2", seed=1), make_model("gpt2", seed=2)
    with pytest.raises(ValueError, match="option of method 'weight'"):
        lf.align(a, b, "permutation", token_counts=torch.ones(VOCAB))
