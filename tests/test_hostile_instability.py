"""Hostile instability units: a parent's optimizer state (parent/step{k}/optimizer.safetensors) that
is damaged is validated in full before use; the parent's unit is warned about and trained again, and
its children end bit for bit as in a clean run (a truncated moment ended in a shape error deep
inside AdamW, a negative one in NaN weights)."""
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from lmc_fast.instability import instability
from test_instability import _weights, tiny_recipe

KW = dict(spawn_steps=[4, 0], copies=2, lambdas=3, eval_batches=1)
FORMAT = "lmc_fast.instability/1.optimizer"


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    out = tmp_path_factory.mktemp("instability") / "clean"
    instability(tiny_recipe(), out, **KW)
    return out


def _tensors(edit):
    def damage(path):
        t = load_file(str(path))
        edit(t)
        save_file(t, str(path), metadata={"format": FORMAT})
    return damage


def _first(suffix, change):
    def edit(t):
        k = sorted(k for k in t if k.endswith(suffix))[0]
        t[k] = change(t[k])
    return edit


def _drop(suffix):
    def edit(t):
        del t[sorted(k for k in t if k.endswith(suffix))[0]]
    return edit


def _bytes(change):
    def damage(path):
        path.write_bytes(change(path.read_bytes()))
    return damage


def _foreign(path):
    save_file(load_file(str(path)), str(path), metadata={"format": "something else"})


# (case id, damage of the parent's optimizer file at step 4)
DAMAGED = [
    ("moment-truncated", _tensors(_first(".exp_avg", lambda v: v.reshape(-1)[:-1].clone()))),
    ("moment-nan", _tensors(_first(".exp_avg", lambda v: torch.full_like(v, float("nan"))))),
    ("second-moment-negative", _tensors(_first(".exp_avg_sq", lambda v: -1 - v))),
    ("moment-float64", _tensors(_first(".exp_avg", lambda v: v.double()))),
    ("moment-missing", _tensors(_drop(".exp_avg_sq"))),
    ("step-past-the-unit", _tensors(_first(".step", lambda v: v + 100))),
    ("unknown-parameter", _tensors(lambda t: t.__setitem__("state.999.exp_avg", torch.zeros(1)))),
    ("every-state-dropped", _tensors(lambda t: [t.pop(k) for k in list(t)[1:]] and None)),
    ("file-truncated", _bytes(lambda b: b[: len(b) // 2])),
    ("not-safetensors", _bytes(lambda b: b"not a safetensors file")),
    ("foreign-metadata", _foreign),
]


@pytest.mark.parametrize("case", DAMAGED, ids=[c[0] for c in DAMAGED])
def test_a_damaged_parent_optimizer_is_trained_again(tmp_path, clean, case):
    _, damage = case
    out = tmp_path / "run"
    shutil.copytree(clean, out)
    shutil.rmtree(out / "children" / "spawn4")  # its children start from the damaged state
    damage(out / "parent" / "step4" / "optimizer.safetensors")
    with pytest.warns(UserWarning, match=r"step4/optimizer\.safetensors: (damaged|unreadable) optimizer state"):
        res = instability(tiny_recipe(), out, **KW)
    assert res["units"]["trained"] == 3  # the parent at step 4 and its two children
    for c in range(2):
        unit = f"children/spawn4/copy{c}"
        want, got = _weights(clean / unit), _weights(out / unit)
        assert all(torch.equal(want[k], got[k]) for k in want), unit
    again = instability(tiny_recipe(), out, **KW)  # the retrained unit is whole
    assert again["units"]["trained"] == 0
