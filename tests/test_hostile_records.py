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
    ("lm-flag-flipped", lambda r: _sums(r, "is_lm", lambda v: not v)),
    ("one-mixture-other-count", lambda r: _sums(r, "n", lambda n: n - 1, which=1)),
    ("bin-counts-not-summing-to-n", lambda r: _sums(r, "bin_n", _bins("bin_n", lambda v: [x + 1 for x in v]))),
    ("bin-count-moved", lambda r: _sums(r, "bin_n", _bins("bin_n", _move_one_count))),
    ("fewer-bins", lambda r: [_sums(r, f, _bins(f, lambda v: v[:-1])) for f in ("bin_n", "bin_acc", "bin_conf")]),
    ("negative-bin-confidence", lambda r: _sums(r, "bin_conf", _bins("bin_conf", lambda v: [-x for x in v]))),
    ("mixture-sums-null", lambda r: r["sums"].__setitem__(0, None)),
    ("done-not-bool", lambda r: r.__setitem__("done", "no")),
    ("extra-field", lambda r: r.__setitem__("loss_override", 0.0)),
    # the record's own counts and hashes
    ("negated-batches", lambda r: r.__setitem__("batches", -r["batches"])),
    ("zero-batches", lambda r: r.__setitem__("batches", 0)),
    ("fewer-batches", lambda r: r.__setitem__("batches", 1)),  # its data hash is of all three
    ("batches-a-string", lambda r: r.__setitem__("batches", str(r["batches"]))),
    ("batches-a-float", lambda r: r.__setitem__("batches", float(r["batches"]))),
    ("data-hash-edited", lambda r: r.__setitem__("data", "0" * 32)),
    ("other-format", lambda r: r.__setitem__("format", 99)),
    ("other-block", lambda r: r.__setitem__("key", "0" * 32)),
    ("sums-not-a-list", lambda r: r.__setitem__("sums", {})),
    ("one-mixture-missing", lambda r: r["sums"].pop()),
    # the sums
    ("negated-sums-batches", lambda r: _sums(r, "batches", lambda n: -n)),
    ("doubled-count", lambda r: _sums(r, "n", lambda n: 2 * n)),
    ("negated-correct", lambda r: _sums(r, "correct", _hexed(lambda x: -x - 1))),
    ("nan-correct", lambda r: _sums(r, "correct", lambda v: {"hex": "nan"})),
    ("nan-bins", lambda r: _sums(r, "bin_conf", _bins("bin_conf", lambda v: [float("nan")] * len(v)))),
    ("more-bins", lambda r: [_sums(r, f, _bins(f, lambda v: v + [0.0])) for f in ("bin_n", "bin_acc", "bin_conf")]),
    ("bins-of-another-shape", lambda r: [_sums(r, f, lambda v: dict(v, shape=[3, 5])) for f in ("bin_n", "bin_acc", "bin_conf")]),
    ("bins-of-another-dtype", lambda r: _sums(r, "bin_n", lambda v: dict(v, dtype="float32"))),
    ("hex-not-a-float", lambda r: _sums(r, "loss", lambda v: {"hex": "zz"})),
    ("hex-too-large", lambda r: _sums(r, "loss", lambda v: {"hex": "0x1p+99999"})),
    ("hex-a-list", lambda r: _sums(r, "loss", lambda v: {"hex": ["0x1p+0"]})),
    ("task-unknown", lambda r: _sums(r, "task", lambda t: "regression")),
    ("task-of-the-other-kind", lambda r: _sums(r, "task", lambda t: "classify" if t != "classify" else "next_token")),
    ("task-a-number", lambda r: _sums(r, "task", lambda t: 3)),
    ("is-lm-a-string", lambda r: _sums(r, "is_lm", lambda v: "yes")),
]


def _lm_data(n=3, batch=2):
    return [(x, x) for x in (make_inputs("gpt2", seed=100 + s, batch=batch) for s in range(n))]


# (id, model kind, data, whether the record is a block's unfinished one)
SWEEPS = [("vit", "vit", _data, False), ("gpt2", "gpt2", _lm_data, False), ("vit-unfinished", "vit", _data, True),
          ("gpt2-unfinished", "gpt2", _lm_data, True)]


@pytest.mark.parametrize("sweep", SWEEPS, ids=[s[0] for s in SWEEPS])
@pytest.mark.parametrize("case", TAMPERED, ids=[c[0] for c in TAMPERED])
def test_tampered_sweep_record_is_recomputed(tmp_path, case, sweep):
    """Every tamper, of a finished block's record and of one cut short (the sweep was killed after two
    of its three batches: the resumed sweep would add the third to the record's sums), on a classifier
    and on a language model: a warning naming the file, and the numbers of a clean run."""
    _, tamper = case
    _, kind, make_data, unfinished = sweep
    a, b = make_model(kind, seed=1), make_model(kind, seed=2)
    data = make_data()
    clean = lf.barrier(a, b, data, 3, max_tokens=64)
    folder = tmp_path / "records"
    lf.barrier(a, b, data[:2] if unfinished else data, 3, max_tokens=64, checkpoint=folder)
    (path,) = folder.glob("*.json")
    record = json.loads(path.read_text())
    if unfinished:
        record["done"] = False  # what the record of a sweep killed after two batches holds
    tamper(record)
    path.write_text(json.dumps(record))
    with pytest.warns(UserWarning, match=rf"{path.name}: (not a record of this block|the first \d+ batches differ)"):
        got = lf.barrier(a, b, data, 3, max_tokens=64, checkpoint=folder)
    assert got.loss == clean.loss and got.acc == clean.acc and got.ece == clean.ece
    assert got.reliability == clean.reliability and got.ppl == clean.ppl
    assert got.loss[0] >= 0 and got.loss_a == clean.loss_a  # never a negative loss at lambda 0
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


SIMPLEX_TAMPERED = [c for c in TAMPERED if c[0] in ("negated-count", "bin-counts-not-summing-to-n", "nan-loss",
                                                     "fewer-bins", "negative-loss")]


@pytest.mark.parametrize("case", SIMPLEX_TAMPERED, ids=[c[0] for c in SIMPLEX_TAMPERED])
def test_tampered_simplex_record_is_recomputed(tmp_path, case):
    """lf.simplex(..., checkpoint=DIR) reads its records back the same way: the numbers of a clean run."""
    _, tamper = case
    models = [make_model("vit", seed=s) for s in (1, 2, 3)]
    data = _data()
    clean = lf.simplex(models, data, n=3, seed=0)
    folder = tmp_path / "records"
    lf.simplex(models, data, n=3, seed=0, checkpoint=folder)
    for path in folder.glob("*.json"):
        record = json.loads(path.read_text())
        tamper(record)
        path.write_text(json.dumps(record))
    with pytest.warns(UserWarning, match="not a record of this block"):
        got = lf.simplex(models, data, n=3, seed=0, checkpoint=folder)
    assert {k: v for k, v in got.items() if k != "seconds"} == {k: v for k, v in clean.items() if k != "seconds"}
    assert all(row["loss"] >= 0 for row in got["models"])
