"""Hostile stored records: a sweep record (`checkpoint=DIR`) edited by hand is validated in full
and, when damaged, discarded with a warning naming the file and recomputed: the numbers are those
of a clean run, never the record's."""
import json

import pytest
import torch

import lmc_fast as lf
from zoo import make_inputs, make_model


def _data(n=3, batch=4):
    return [(make_inputs("vit", seed=100 + s, batch=batch),
             torch.randint(0, 5, (batch,), generator=torch.Generator().manual_seed(s))) for s in range(n)]


def _hexed(f):
    return lambda v: {"hex": f(float.fromhex(v["hex"])).hex()}


def _sums(record, field, change, which=None):
    for i, s in enumerate(record["sums"]):
        if which is None or i == which:
            s[field] = change(s[field])


def _bins(field, change):
    def edit(v):
        vals = [float.fromhex(x["hex"]) for x in v["values"]]
        vals = change(vals)
        return dict(v, values=[{"hex": x.hex()} for x in vals], shape=[len(vals)])
    return edit


def _move_one_count(vals):
    vals = list(vals)
    i = max(range(len(vals)), key=lambda k: vals[k])
    vals[i] -= 1
    vals[(i + 1) % len(vals)] += 1  # the total stays n; the bin's confidences no longer fit
    return vals


# (case id, edit of the parsed record)
TAMPERED = [
    ("negated-count", lambda r: _sums(r, "n", lambda n: -n)),
    ("negative-loss", lambda r: _sums(r, "loss", _hexed(lambda x: -x))),
    ("nan-loss", lambda r: _sums(r, "loss", lambda v: {"hex": "nan"})),
    ("inf-loss", lambda r: _sums(r, "loss", lambda v: {"hex": "inf"})),
    ("plain-float-loss", lambda r: _sums(r, "loss", lambda v: 0.0)),
    ("correct-above-n", lambda r: _sums(r, "correct", _hexed(lambda x: x + 1000))),
    ("fractional-correct", lambda r: _sums(r, "correct", _hexed(lambda x: x + 0.5))),
    ("lm-flag-flipped", lambda r: _sums(r, "is_lm", lambda v: True)),
    ("one-mixture-other-count", lambda r: _sums(r, "n", lambda n: n - 1, which=1)),
    ("bin-counts-not-summing-to-n", lambda r: _sums(r, "bin_n", _bins("bin_n", lambda v: [x + 1 for x in v]))),
    ("bin-count-moved", lambda r: _sums(r, "bin_n", _bins("bin_n", _move_one_count))),
    ("fewer-bins", lambda r: [_sums(r, f, _bins(f, lambda v: v[:-1])) for f in ("bin_n", "bin_acc", "bin_conf")]),
    ("negative-bin-confidence", lambda r: _sums(r, "bin_conf", _bins("bin_conf", lambda v: [-x for x in v]))),
    ("mixture-sums-null", lambda r: r["sums"].__setitem__(0, None)),
    ("done-not-bool", lambda r: r.__setitem__("done", "no")),
    ("extra-field", lambda r: r.__setitem__("loss_override", 0.0)),
]


@pytest.mark.parametrize("case", TAMPERED, ids=[c[0] for c in TAMPERED])
def test_tampered_sweep_record_is_recomputed(tmp_path, case):
    _, tamper = case
    a, b = make_model("vit", seed=1), make_model("vit", seed=2)
    data = _data()
    clean = lf.barrier(a, b, data, 3, max_tokens=64)
    folder = tmp_path / "records"
    lf.barrier(a, b, data, 3, max_tokens=64, checkpoint=folder)
    (path,) = folder.glob("*.json")
    record = json.loads(path.read_text())
    tamper(record)
    path.write_text(json.dumps(record))
    with pytest.warns(UserWarning, match=rf"{path.name}: not a record of this block"):
        got = lf.barrier(a, b, data, 3, max_tokens=64, checkpoint=folder)
    assert got.loss == clean.loss and got.acc == clean.acc and got.ece == clean.ece
    assert got.reliability == clean.reliability and got.ppl == clean.ppl
    # the recomputed record replaced the damaged one, and is trusted as it stands
    again = lf.barrier(a, b, data, 3, max_tokens=64, checkpoint=folder)
    assert again.loss == clean.loss


@pytest.mark.parametrize("foreign", [b"my notes\n", b'{"results": [1, 2, 3]}', b"\xff\xfe\x00binary", b"[]"])
def test_a_foreign_file_at_a_record_name_is_refused_and_kept(tmp_path, foreign):
    """A file at a record's name that no sweep wrote (the user's) is neither trusted nor replaced: one
    line naming it, and its bytes stay as they were."""
    a, b = make_model("vit", seed=1), make_model("vit", seed=2)
    data = _data()
    folder = tmp_path / "records"
    lf.barrier(a, b, data, 3, max_tokens=64, checkpoint=folder)
    (path,) = folder.glob("*.json")
    path.write_bytes(foreign)
    with pytest.raises(ValueError, match="not a sweep record") as info:
        lf.barrier(a, b, data, 3, max_tokens=64, checkpoint=folder)
    assert path.name in str(info.value) and "\n" not in str(info.value)
    assert path.read_bytes() == foreign
