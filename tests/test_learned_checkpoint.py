"""Learned matching resumes from its checkpoint exactly where an uninterrupted run would be."""
import pytest
import torch

import lmc_fast as lf
from lmc_fast.match import learned
from lmc_fast.match.learned import learn_alignments
from lmc_fast.models.adapters import standard_params
from lmc_fast.symmetry import Alignment, canonical_params, canonical_spec
from zoo import logits, make_inputs, make_model

TIMES = ("seconds", "steps_per_second")


def _planted():
    """B = A under a random symmetry; labels from A; the identity as a deliberately poor start."""
    a = make_model("vit", seed=61, dtype=torch.float32)
    arch, raw = standard_params(a)
    spec = canonical_spec(arch)
    b = Alignment.random(spec, seed=5).apply(a)
    data = [make_inputs("vit", seed=s, batch=8, dtype=torch.float32) for s in range(5)]
    with torch.no_grad():
        data = [(x, logits(a, x).argmax(-1)) for x in data]
    pa, pb = canonical_params(arch, raw), canonical_params(arch, standard_params(b)[1])
    return spec, [pa, pb], [Alignment.identity(spec).elements], data[:4], data[4:]


def _run(**kw):
    spec, params, init, train, val = _planted()
    opts = dict(steps=11, lr=0.02, eval_every=4, patience=10, seed=3)
    opts.update(kw)
    return learn_alignments(spec, params, init, train, val, **opts)


def _same(run_a, run_b):
    (hard_a, info_a), (hard_b, info_b) = run_a, run_b
    assert {k: v for k, v in info_a.items() if k not in TIMES} == {k: v for k, v in info_b.items() if k not in TIMES}
    for ea, eb in zip(hard_a, hard_b):
        assert ea.keys() == eb.keys()
        for g in ea:
            for k in ea[g]:
                assert torch.equal(ea[g][k], eb[g][k]), (g, k)


def _killed_after(monkeypatch, steps_done: int):
    """sample_weights raises at step steps_done + 1: the process 'dies' mid-run."""
    real, calls = learned.sample_weights, []

    def dying(*args, **kw):
        calls.append(1)
        if len(calls) > steps_done:
            raise KeyboardInterrupt("killed")
        return real(*args, **kw)

    monkeypatch.setattr(learned, "sample_weights", dying)


@pytest.mark.parametrize("sides", ["b", "both"])  # "both": A's latents and warm starts are state too
def test_resumed_run_ends_exactly_as_an_uninterrupted_one(tmp_path, monkeypatch, sides):
    ckpt = tmp_path / "unit.learned.ckpt"
    whole = _run(sides=sides)
    with monkeypatch.context() as m:
        _killed_after(m, 8)  # checkpoints at steps 3 and 6; the run dies during step 9
        with pytest.raises(KeyboardInterrupt):
            _run(checkpoint=ckpt, checkpoint_every=3, sides=sides)
    assert ckpt.exists()
    calls = []
    real = learned.sample_weights
    monkeypatch.setattr(learned, "sample_weights", lambda *a, **k: calls.append(1) or real(*a, **k))
    resumed = _run(checkpoint=ckpt, checkpoint_every=3, sides=sides)
    assert len(calls) == 11 - 6  # resumed at step 6, not from the start
    _same(whole, resumed)
    assert whole[1]["steps"] == 11 and len(whole[1]["val_history"]) == 4


def test_a_checkpoint_for_other_inputs_is_ignored_with_a_warning(tmp_path):
    ckpt = tmp_path / "c.ckpt"
    _run(steps=7, checkpoint=ckpt, checkpoint_every=3)  # leaves the state at step 6
    with pytest.warns(UserWarning, match="other inputs"):
        other = _run(lr=0.01, checkpoint=ckpt, checkpoint_every=3)
    _same(other, _run(lr=0.01))
    ckpt.write_bytes(b"not a checkpoint")  # not ours: refused, never overwritten
    with pytest.raises(ValueError, match="something other than a learned-matching checkpoint"):
        _run(checkpoint=ckpt)
    assert ckpt.read_bytes() == b"not a checkpoint"


def test_checkpoint_options_are_checked():
    with pytest.raises(ValueError, match="checkpoint_every needs checkpoint"):
        _run(checkpoint_every=3)
    with pytest.raises(ValueError, match="checkpoint_every must be"):
        _run(checkpoint="x.ckpt", checkpoint_every=0)


def test_align_learned_resumes_through_the_public_api(tmp_path, monkeypatch):
    a, b = make_model("vit", seed=71, dtype=torch.float32), make_model("vit", seed=72, dtype=torch.float32)
    data = [(make_inputs("vit", seed=s, batch=8, dtype=torch.float32),
             torch.randint(0, 5, (8,), generator=torch.Generator().manual_seed(s))) for s in range(4)]
    ckpt = tmp_path / "al.ckpt"
    whole = lf.align(a, b, "learned", data=data, steps=6, eval_every=2)
    with monkeypatch.context() as m:
        _killed_after(m, 4)
        with pytest.raises(KeyboardInterrupt):
            lf.align(a, b, "learned", data=data, steps=6, eval_every=2, checkpoint=ckpt, checkpoint_every=2)
    resumed = lf.align(a, b, "learned", data=data, steps=6, eval_every=2, checkpoint=ckpt, checkpoint_every=2)
    for g in whole.elements:
        for k in whole.elements[g]:
            assert torch.equal(whole.elements[g][k], resumed.elements[g][k])
    assert {k: v for k, v in whole.info.items() if k not in TIMES} == \
        {k: v for k, v in resumed.info.items() if k not in TIMES}
