"""Tiny Dirichlet concentrations: every sampler (the simplex sweep's, learned merging's, Mixup's)
draws from the distribution asked for. Plain Gamma(alpha) draws underflow to zero as alpha
shrinks, which made every simplex sample the centroid (so the "worst sample" was the centroid)
and Mixup's weights 0 / 0; past float64's smallest normal number the log-space draws overflowed."""
import pytest
import torch

import lmc_fast as lf
from lmc_fast.data.augment import Mixup
from lmc_fast.match.learned import sample_weights
from lmc_fast.sweep.simplex import dirichlet
from zoo import make_inputs, make_model

#: down to float64's subnormals (5e-324 the least), where log(u) / alpha overflowed to -inf in every
#: component and the draws were NaN (silently, in Mixup's images)
TINY = [5e-324, 1e-320, 1e-308, 1e-30, 1e-12, 1e-5]


def _second_moment(alpha, n):
    """E[w_i^2] of a symmetric Dirichlet(alpha) over n components."""
    return 1 / n**2 + (n - 1) / (n**2 * (n * alpha + 1))


# (sampler id, (rows, n, alpha) -> (rows, n) weights)
SAMPLERS = [
    ("simplex", lambda rows, n, alpha: dirichlet(rows, n, alpha, seed=0)),
    ("learned-merge", lambda rows, n, alpha: sample_weights("narrow", n, rows, torch.Generator().manual_seed(0), alpha)),
]


@pytest.mark.parametrize("alpha", TINY + [0.05, 0.5])
@pytest.mark.parametrize("sampler", SAMPLERS, ids=[s[0] for s in SAMPLERS])
def test_dirichlet_draws_match_the_distribution(sampler, alpha):
    _, draw = sampler
    w = draw(4000, 3, alpha)
    assert w.shape == (4000, 3) and torch.isfinite(w).all() and (w >= 0).all()
    assert torch.allclose(w.sum(-1), torch.ones(4000, dtype=w.dtype), atol=1e-12)
    want = _second_moment(alpha, 3)
    got = float((w * w).mean())
    assert abs(got - want) < 0.02, (got, want)  # ~6 standard errors over 12000 entries
    assert abs(float(w.mean(0).max()) - 1 / 3) < 0.04  # symmetric


def test_plain_draws_are_kept_where_they_do_not_underflow():
    """alpha >= 1 draws as before (normalised Gamma draws): seeded results stay what they were."""
    gen = torch.Generator().manual_seed(3)
    g = torch._standard_gamma(torch.full((5, 3), 1.5, dtype=torch.float64), generator=gen)
    assert torch.equal(dirichlet(5, 3, 1.5, seed=3), g / g.sum(-1, keepdim=True))


@pytest.mark.parametrize("alpha", TINY)
def test_simplex_samples_near_a_vertex_for_tiny_alpha(alpha):
    models = [make_model("vit", seed=s) for s in range(3)]
    data = [(make_inputs("vit", seed=1, batch=4), torch.zeros(4, dtype=torch.long))]
    res = lf.simplex(models, data, n=6, alpha=alpha)
    for row in res["samples"]:
        assert max(row["weights"]) > 0.99, row["weights"]
    assert max(res["worst"]["weights"]) > 0.99  # the worst sample is not the centroid


@pytest.mark.parametrize("alpha", TINY)
def test_mixup_weights_are_finite_for_tiny_alpha(alpha):
    B = 64
    x = torch.eye(B, dtype=torch.float64).reshape(B, 1, 1, B)  # row i marks sample i
    out = Mixup(alpha)(x, torch.Generator().manual_seed(0)).reshape(B, B)
    assert torch.isfinite(out).all()
    assert (out.max(-1).values > 0.99).all()  # Beta(alpha, alpha) draws sit at 0 or 1


@pytest.mark.parametrize("alpha", [float("nan"), float("inf"), True, "1"])
def test_mixup_refuses_a_bad_alpha(alpha):
    with pytest.raises(ValueError, match="alpha"):
        Mixup(alpha)
