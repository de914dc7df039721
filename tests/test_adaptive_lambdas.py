"""lambdas="adaptive": a coarse grid refined at the peak, checked on curves whose maximum is known and
against a fine grid on real sweeps."""
import math

import pytest

import lmc_fast as lf
from lmc_fast.sweep.adaptive import Adaptive, adaptive_points
from zoo import make_inputs, make_model, make_targets


def _curve(bump):
    """evaluate() of a path whose end losses are 1 and 2 and whose signed curve is bump(lam)."""
    calls = []

    def evaluate(points):
        calls.extend(points)
        return {l: {"loss": (1 - l) * 1.0 + l * 2.0 + bump(l)} for l in points}
    return evaluate, calls


def _true_max(bump):
    return max(bump(i / 100_000) for i in range(100_001))


@pytest.mark.parametrize("bump", [
    lambda l: 0.5 * math.sin(math.pi * l),                         # symmetric
    lambda l: 2.0 * l * (1 - l) ** 3,                              # skewed toward A
    lambda l: 0.3 * math.sin(math.pi * l) ** 4,                    # sharp shoulders
    lambda l: 0.05 * math.exp(-((l - 0.62) / 0.12) ** 2),          # off-centre bump
], ids=["sine", "skewed", "peaked", "off-centre"])
def test_smooth_peaks_are_found_to_tol_with_fewer_points_than_the_grid(bump):
    evaluate, calls = _curve(bump)
    by_lam, info = adaptive_points(evaluate, Adaptive(tol=1e-4))
    signed = {l: r["loss"] - ((1 - l) + 2 * l) for l, r in by_lam.items()}
    best = max(signed.values())
    assert best <= _true_max(bump) + 1e-12  # a lower bound: every value is measured
    assert _true_max(bump) - best < 1e-4
    assert info["peak_resolved"] and info["evaluations"] == len(by_lam) == len(set(calls)) <= 15


def test_a_path_without_a_bump_stops_within_the_budget():
    evaluate, _ = _curve(lambda l: -0.2 * l * (1 - l))  # convex: the barrier is 0, at the ends
    by_lam, info = adaptive_points(evaluate, Adaptive())
    assert info["evaluations"] <= 25
    assert max(r["loss"] - ((1 - l) + 2 * l) for l, r in by_lam.items()) == pytest.approx(0.0, abs=1e-15)


def test_a_spike_between_the_coarse_points_is_missed_and_the_result_stays_a_lower_bound():
    """The documented limit: a spike narrower than the coarse spacing is not seen (as on any grid of that
    spacing); the broad peak is resolved and the barrier is never above the true one."""
    spike = lambda l: 0.4 * math.exp(-((l - 0.57) / 0.002) ** 2) + 0.01 * math.sin(math.pi * l)  # noqa: E731
    evaluate, _ = _curve(spike)
    by_lam, info = adaptive_points(evaluate, Adaptive(tol=1e-5, max_evaluations=9))
    assert info["evaluations"] <= 9
    best = max(r["loss"] - ((1 - l) + 2 * l) for l, r in by_lam.items())
    assert best <= _true_max(spike)
    assert _true_max(spike) - best > 0.3  # the spike (0.4 high, 0.004 wide) is missed ...
    assert best == pytest.approx(0.01, abs=1e-4)  # ... and the broad 0.01 bump is found


def test_through_lf_barrier_it_matches_a_fine_grid():
    a, b = make_model("gpt2", seed=1), make_model("gpt2", seed=2)
    data = []
    for s in range(2):
        x = make_inputs("gpt2", seed=s)
        data.append((x, make_targets("gpt2", x, seed=s)))
    fine = lf.barrier(a, b, data, lambdas=201, space="raw")
    res = lf.barrier(a, b, data, lambdas="adaptive", space="raw")
    assert res.adaptive["evaluations"] == len(res.lambdas) < 25
    assert res.lambdas == sorted(res.lambdas) and res.lambdas[0] == 0.0 and res.lambdas[-1] == 1.0
    assert abs(res.barrier - fine.barrier) < 1e-3 and res.barrier <= fine.barrier + 1e-6
    assert res.to_dict()["adaptive"]["peak_resolved"] is True
    assert lf.barrier(a, b, data, lambdas=5, space="raw").adaptive is None


@pytest.mark.parametrize("bad, message", [
    (Adaptive(tol=0.0), "tol must be"), (Adaptive(start=2), "start must be"),
    (Adaptive(start=9, max_evaluations=5), "below start"), (Adaptive(min_width=1.5), "min_width"),
    ("adaptve", "or 'adaptive'")])
def test_bad_adaptive_settings_are_refused_in_one_line(bad, message):
    a, b = make_model("vit", seed=1), make_model("vit", seed=2)
    x = make_inputs("vit")
    with pytest.raises(ValueError, match=message) as info:
        lf.barrier(a, b, [(x, make_targets("vit", x))], lambdas=bad)
    assert "\n" not in str(info.value)
