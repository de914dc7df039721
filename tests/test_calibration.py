"""Calibration along the path: the reliability diagram every metrics row carries (the ECE bins
as mean confidence / accuracy / count), kept by BarrierResult and its JSON, and drawn by
`plot_calibration` / `lmc-fast plot --calibration`."""
import json

import numpy as np
import pytest
import torch

import lmc_fast as lf
from lmc_fast.cli import main
from lmc_fast.plots import plot_calibration
from lmc_fast.sweep.barrier import BarrierResult
from lmc_fast.sweep.metrics import ECE_BINS, MetricSums
from test_cli import check_error, check_png, run
from test_sweep import classification_data
from zoo import make_model


def _numpy_reliability(logits: np.ndarray, targets: np.ndarray):
    keep = targets != -100
    logits, targets = logits[keep], targets[keep]
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    conf, hit = p.max(1), (p.argmax(1) == targets).astype(float)
    bins = np.minimum((conf * ECE_BINS).astype(int), ECE_BINS - 1)
    n = np.bincount(bins, minlength=ECE_BINS)
    sc = np.bincount(bins, weights=conf, minlength=ECE_BINS)
    sa = np.bincount(bins, weights=hit, minlength=ECE_BINS)
    with np.errstate(invalid="ignore", divide="ignore"):
        return sc / n, sa / n, n, np.abs(sc - sa).sum() / n.sum()


def test_reliability_equals_a_direct_numpy_computation():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(300, 6, generator=g, dtype=torch.float64) * 2.5
    targets = torch.randint(0, 6, (300,), generator=g)
    targets[::7] = -100  # skipped: in no bin
    sums = MetricSums()
    for lo, hi in ((0, 100), (100, 130), (130, 300)):  # batches of different sizes
        sums.add(logits[lo:hi], targets[lo:hi])
    row = sums.result()
    conf, acc, n, ece = _numpy_reliability(logits.numpy(), targets.numpy())
    rel = row["reliability"]
    assert set(rel) == {"conf", "acc", "n"} and all(len(v) == ECE_BINS for v in rel.values())
    assert rel["n"] == n.tolist() and sum(rel["n"]) == int((targets != -100).sum())
    assert all(type(v) is int for v in rel["n"])
    for got, want in ((rel["conf"], conf), (rel["acc"], acc)):
        for g_, w_, count in zip(got, want, n):
            assert (g_ is None) if count == 0 else g_ == pytest.approx(w_, rel=1e-12)
    assert any(c == 0 for c in n) and sum(c > 0 for c in n) > 3  # empty and filled bins both tested
    assert row["ece"] == pytest.approx(ece, rel=1e-12)
    json.dumps(row, allow_nan=False)  # JSON-ready


def test_barrier_result_keeps_reliability_and_round_trips_json():
    a, b = make_model("vit", seed=1), make_model("vit", seed=2)
    data = classification_data("vit")
    examples = sum(len(y) for _, y in data)
    results = [lf.barrier(a, b, data, lambdas=[0.0, 0.3, 1.0], engine=e) for e in ("loop", "fused")]
    for res in results:
        assert len(res.reliability) == 3
        for d, ece in zip(res.reliability, res.ece):
            assert sum(d["n"]) == examples
            gaps = sum(abs(c - a_) * n for c, a_, n in zip(d["conf"], d["acc"], d["n"]) if n)
            assert gaps / examples == pytest.approx(ece, rel=1e-9, abs=1e-12)
        d = json.loads(res.to_json(allow_nan=False))
        assert d["reliability"] == res.to_dict()["reliability"]
        assert BarrierResult(**d) == res
    loop, fused = results  # both engines bin alike
    for d1, d2 in zip(loop.reliability, fused.reliability):
        assert d1["n"] == d2["n"]


def _curve(ece, reliability=True):
    lams = [0.0, 0.25, 0.5, 0.75, 1.0]
    c = {"lambdas": lams, "loss": [1.0, 1.4, 1.6, 1.3, 1.1], "acc": [0.8, 0.6, 0.5, 0.6, 0.8], "ece": ece,
         "barrier": 0.5}
    if reliability:
        rel = []
        for k in range(len(lams)):
            n = [0] * ECE_BINS
            n[5 + k], n[12] = 40, 10 + k
            conf = [None if not v else (i + 0.5) / ECE_BINS for i, v in enumerate(n)]
            acc = [None if not v else min(1.0, (i + 0.5) / ECE_BINS + 0.1) for i, v in enumerate(n)]
            rel.append({"conf": conf, "acc": acc, "n": n})
        c["reliability"] = rel
    return c


def test_plot_calibration_from_a_sweep_result(tmp_path, capsys):
    a, b = make_model("vit", seed=1), make_model("vit", seed=2)
    res = lf.barrier(a, b, classification_data("vit"), lambdas=4)  # no 0.5 on the grid: the nearest is named
    (tmp_path / "r.json").write_text(json.dumps({"kind": "sweep", "results": {"none": res.to_dict()}}))
    rc, out, err = run(capsys, "plot", tmp_path / "r.json", "--calibration", "--out", tmp_path / "cal.png")
    assert rc == 0, err
    assert "cal.png" in out and (tmp_path / "cal.png").stat().st_size > 0
    check_png(tmp_path / "cal.png")
    rc, _, err = run(capsys, "plot", tmp_path / "r.json", "--calibration")  # default name
    assert rc == 0, err
    check_png(tmp_path / "r_calibration.png")
    # several files: overlaid (the same curve name in both: labelled by file)
    (tmp_path / "w.json").write_text(json.dumps({"kind": "sweep", "results": {"none": _curve([0.1, 0.05, 0.02, 0.04, 0.1])}}))
    rc, _, err = run(capsys, "plot", tmp_path / "r.json", tmp_path / "w.json", "--calibration", "--out",
                     tmp_path / "both.png", "--title", "two")
    assert rc == 0, err
    check_png(tmp_path / "both.png")
    assert plot_calibration(res, tmp_path / "api.png") == tmp_path / "api.png"  # a BarrierResult directly
    check_png(tmp_path / "api.png")


def test_plot_calibration_errors_are_one_line(tmp_path, capsys):
    old = {"kind": "sweep", "results": {"weight": _curve([0.1] * 5, reliability=False)}}  # written before reliability
    (tmp_path / "old.json").write_text(json.dumps(old))
    rc, _, err = run(capsys, "plot", tmp_path / "old.json", "--calibration", "--out", tmp_path / "c.png")
    check_error(rc, err, "old.json", "no calibration data", "re-run the sweep")
    assert not (tmp_path / "c.png").exists()
    rc, _, err = run(capsys, "plot", tmp_path / "old.json", "--out", tmp_path / "curves.png")  # still plots its curves
    assert rc == 0, err
    check_png(tmp_path / "curves.png")
    bad = _curve([0.1] * 5)
    bad["reliability"][2] = {"conf": [0.5], "acc": [0.5, 0.4], "n": [3]}
    (tmp_path / "bad.json").write_text(json.dumps({"kind": "sweep", "results": {"w": bad}}))
    rc, _, err = run(capsys, "plot", tmp_path / "bad.json", "--calibration", "--out", tmp_path / "c.png")
    check_error(rc, err, "bad.json", "reliability 2")
    (tmp_path / "hello.json").write_text(json.dumps({"hello": 1}))
    rc, _, err = run(capsys, "plot", tmp_path / "hello.json", "--calibration", "--out", tmp_path / "c.png")
    check_error(rc, err, "hello.json", "no barrier curves")
    (tmp_path / "good.json").write_text(json.dumps({"results": {"w": _curve([0.1] * 5)}}))
    rc, _, err = run(capsys, "plot", tmp_path / "good.json", tmp_path / "old.json", "--calibration", "--out",
                     tmp_path / "c.png")
    check_error(rc, err, "old.json", "no calibration data")
    rc, _, err = run(capsys, "plot", tmp_path / "good.json", "--calibration", "--out", tmp_path / "good.json")
    check_error(rc, err, "--out")
    assert not (tmp_path / "c.png").exists()
    assert json.loads((tmp_path / "good.json").read_text())["results"]["w"]["ece"] == [0.1] * 5


def test_metric_sums_stay_on_the_device_until_read_and_read_the_same_whenever():
    """MetricSums.add keeps each batch's sums on the logits' device; reading a field folds them in.
    The sums equal a plain host computation (targets -100 dropped, bincount bins), and reading
    them after every batch or only at the end gives the same bits."""
    import torch.nn.functional as F

    from lmc_fast.sweep.metrics import ECE_BINS, MetricSums

    g = torch.Generator().manual_seed(0)
    batches = []
    for _ in range(5):
        lg, tg = torch.randn(9, 7, 11, generator=g) * 3, torch.randint(0, 11, (9, 7), generator=g)
        tg[torch.rand(9, 7, generator=g) < 0.3] = -100
        batches.append((lg, tg))
    late, early = MetricSums(is_lm=True, task="masked_token"), MetricSums(is_lm=True, task="masked_token")
    loss, correct, n = 0.0, 0.0, 0
    bin_n, bin_acc, bin_conf = (torch.zeros(ECE_BINS, dtype=torch.float64) for _ in range(3))
    for lg, tg in batches:
        late.add(lg, tg)
        assert late._pending, "nothing should have been folded in yet"
        early.add(lg, tg)
        assert early.n >= 0 and not early._pending  # reading folds in
        kept = tg.reshape(-1) != -100
        l, t = lg.reshape(-1, 11)[kept].double(), tg.reshape(-1)[kept]
        loss += F.cross_entropy(l, t, reduction="sum").item()
        conf, pred = l.softmax(-1).max(-1)
        hit = (pred == t).double()
        correct, n = correct + hit.sum().item(), n + t.numel()
        bins = (conf * ECE_BINS).long().clamp(max=ECE_BINS - 1)
        bin_n += torch.bincount(bins, minlength=ECE_BINS).double()
        bin_acc += torch.bincount(bins, weights=hit, minlength=ECE_BINS)
        bin_conf += torch.bincount(bins, weights=conf, minlength=ECE_BINS)
    assert late.state().keys() == early.state().keys()
    for name in ("n", "loss", "correct", "bin_n", "bin_acc", "bin_conf"):
        a, b = getattr(late, name), getattr(early, name)
        assert (torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b), name
    assert late.n == n and late.correct == correct and torch.equal(late.bin_n, bin_n)
    assert late.loss == pytest.approx(loss, rel=1e-14) and torch.allclose(late.bin_conf, bin_conf, rtol=1e-14)
    assert torch.equal(late.bin_acc, bin_acc)
    assert late.result() == early.result()


def test_metric_sums_kept_until_read_hold_no_autograd_graph():
    """Sums of logits that require grad (a training loop's monitor) are kept detached: an unread sum must
    not keep its batch's graph and activations alive, and reading it does not warn."""
    import warnings

    logits = torch.randn(20, 7, requires_grad=True)
    sums = MetricSums()
    sums.add(logits * 2, torch.randint(0, 7, (20,)))
    assert sums._pending and not any(t.requires_grad for t in sums._pending)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert sums.n == 20 and sums.loss > 0
