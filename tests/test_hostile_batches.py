"""Hostile batches at every public entry point that takes them: each is refused in one line naming
the bad value, as `lf.barrier` refuses it, before it reaches any computation (no logits for token
id -1, no error from deep inside for a NaN pixel)."""
import pytest
import torch

import lmc_fast as lf
from zoo import make_inputs, make_model

VOCAB = 37  # zoo's tiny GPT-2


def _models(kind):
    return make_model(kind, seed=1, dtype=torch.float32), make_model(kind, seed=2, dtype=torch.float32)


def _tokens(change):
    x = torch.randint(0, VOCAB, (2, 6), generator=torch.Generator().manual_seed(0))
    return change(x)


def _image(change):
    x = make_inputs("vit", seed=1, batch=4, dtype=torch.float32)
    return change(x)


def _set(value):
    def change(x):
        x.view(-1)[3] = value
        return x
    return change


# (case id, model kind, bad inputs, text the one line must hold)
BAD = [
    ("token-minus-one", "gpt2", lambda: _tokens(_set(-1)), "token id -1 is outside the vocabulary"),
    ("token-past-vocab", "gpt2", lambda: _tokens(_set(VOCAB)), f"token id {VOCAB} is outside the vocabulary"),
    ("float-tokens", "gpt2", lambda: _tokens(lambda x: x.float()), "token ids must be a"),
    ("image-nan", "vit", lambda: _image(_set(float("nan"))), "NaN or infinite"),
    ("image-inf", "vit", lambda: _image(_set(float("inf"))), "NaN or infinite"),
    ("image-wrong-shape", "vit", lambda: _image(lambda x: x[:, :, :-1]), "do not fit the model"),
]


def _targets(kind, x):
    return x.clone() if kind == "gpt2" else torch.zeros(x.shape[0], dtype=torch.long)


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_learned_alignment_forward_refuses_bad_inputs(case):
    _, kind, make, text = case
    la = lf.LearnedAlignment(*_models(kind), init="identity")
    with pytest.raises(ValueError, match=text):
        la(make(), lam=0.5)
    with pytest.raises(ValueError, match=text):
        la(make(), lam=[0.25, 0.75])


# (case id, lam): each one line naming lam ("x" and None raised TypeError from torch.as_tensor)
BAD_LAM = [("string", "x"), ("none", None), ("bool", True), ("nan", float("nan")), ("inf-in-a-list", [0.2, float("inf")]),
           ("empty-list", []), ("nested-list", [[0.5]]), ("list-of-strings", ["a", "b"])]


@pytest.mark.parametrize("case", BAD_LAM, ids=[c[0] for c in BAD_LAM])
def test_learned_alignment_forward_refuses_a_bad_lam(case):
    _, lam = case
    la = lf.LearnedAlignment(*_models("gpt2"), init="identity")
    with pytest.raises(ValueError, match="lam must be") as err:
        la(_tokens(lambda x: x), lam=lam)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_activation_matching_refuses_bad_batches(case):
    _, kind, make, text = case
    x = make()
    with pytest.raises(ValueError, match=text):
        lf.align(*_models(kind), "activation", data=[(x, _targets(kind, x))])


NON_FINITE = [c for c in BAD if "NaN" in c[3]]


@pytest.mark.parametrize("case", NON_FINITE, ids=[c[0] for c in NON_FINITE])
def test_sweeps_refuse_non_finite_images(case):
    _, kind, make, text = case
    x = make()
    with pytest.raises(ValueError, match=text):
        lf.barrier(*_models(kind), [(x, _targets(kind, x))], 3)


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_barrier_monitor_refuses_bad_batches_when_built(case):
    """Not at its first measurement, after training steps were spent."""
    from lmc_fast.monitor import BarrierMonitor

    _, kind, make, text = case
    x = make()
    with pytest.raises(ValueError, match=text):
        BarrierMonitor(_models(kind)[0], [(x, _targets(kind, x))], every=10)
