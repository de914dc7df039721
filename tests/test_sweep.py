"""Interpolation, the functional forward, barrier engines and simplex sweeps."""
import math

import pytest
import torch

import lmc_fast as lf
from lmc_fast.models.adapters import standard_params
from lmc_fast.models import functional as Fn
from lmc_fast.sweep.barrier import lambda_grid
from lmc_fast.symmetry import canonical_params
from zoo import KINDS, logits, make_inputs, make_model, make_targets, rel_err, tolerance


def classification_data(kind, n_batches=3, batch=8, classes=5, vocab=37):
    out = []
    for s in range(n_batches):
        x = make_inputs(kind, seed=100 + s, batch=batch, dtype=torch.float32, vocab=vocab)
        y = make_targets(kind, x, s, classes)
        out.append((x, y))
    return out


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("space", ["canonical", "raw"])
def test_functional_forward_matches_model(kind, space):
    m = make_model(kind, seed=41)
    x = make_inputs(kind)
    arch, raw = standard_params(m)
    p = canonical_params(arch, raw) if space == "canonical" else raw
    out = Fn.forward(arch, Fn.stack([p, p]), x)
    assert out.shape[0] == 2
    assert rel_err(out[1], logits(m, x)) < tolerance(kind, 1e-10)


def test_interpolate_endpoints_and_checks():
    a, b = make_model("gpt2", seed=1), make_model("gpt2", seed=2)
    x = make_inputs("gpt2")
    assert rel_err(logits(lf.interpolate([a, b], [1.0, 0.0]), x), logits(a, x)) < 1e-10
    assert rel_err(logits(lf.interpolate([a, b], [0.0, 1.0], space="raw"), x), logits(b, x)) < 1e-12
    mid = lf.interpolate([a, b, a], [0.25, 0.5, 0.25], space="raw")
    assert torch.allclose(mid.blocks[0].mlp.fc1.weight, 0.5 * (a.blocks[0].mlp.fc1.weight + b.blocks[0].mlp.fc1.weight))
    with pytest.raises(ValueError, match="sum to 1"):
        lf.interpolate([a, b], [0.5, 0.6])
    with pytest.raises(ValueError, match="2 models but 3 weights"):
        lf.interpolate([a, b], [0.5, 0.25, 0.25])
    with pytest.raises(ValueError, match="models\\[1\\] does not fit"):
        lf.interpolate([a, make_model("gpt2", d_mlp=40)], [0.5, 0.5])


def test_lambda_grid():
    assert lambda_grid(3) == [0.0, 0.5, 1.0]
    assert lambda_grid([0.2, 0.8]) == [0.2, 0.8]
    with pytest.raises(ValueError):
        lambda_grid(1)
    with pytest.raises(ValueError):
        lambda_grid([1.5])


@pytest.mark.parametrize("kind", KINDS)
def test_fused_engine_equals_loop_float32(kind):
    a, b = make_model(kind, seed=3, dtype=torch.float32), make_model(kind, seed=4, dtype=torch.float32)
    data = classification_data(kind)
    loop = lf.barrier(a, b, data, 7, engine="loop")
    fused = lf.barrier(a, b, data, 7, engine="fused", chunk=3)
    for key in ("loss", "acc"):
        for u, v in zip(getattr(loop, key), getattr(fused, key)):
            assert abs(u - v) <= 1e-5 * max(1.0, abs(u)), (key, u, v)
    assert abs(loop.barrier - fused.barrier) < 1e-5


def test_pass_plan_keeps_passes_within_the_token_budget():
    from lmc_fast.sweep.batched import pass_plan

    assert pass_plan(K=25, B=16, T=65, chunk=32, max_tokens=2048) == (1, 16)    # 1040 tokens a mixture
    assert pass_plan(K=25, B=2, T=65, chunk=32, max_tokens=2048) == (15, 2)     # many mixtures per pass
    assert pass_plan(K=25, B=2, T=65, chunk=4, max_tokens=2048) == (4, 2)       # chunk caps them
    assert pass_plan(K=3, B=1, T=10, chunk=32, max_tokens=10**6) == (3, 1)      # never more than K
    assert pass_plan(K=25, B=256, T=65, chunk=32, max_tokens=2048) == (1, 31)   # the batch is split
    assert pass_plan(K=25, B=4, T=5000, chunk=32, max_tokens=2048) == (1, 1)    # one sample at least


@pytest.mark.parametrize("kind", ["vit", "gpt2", "hf_gpt2"])
@pytest.mark.parametrize("max_tokens", [1, 40, 10**6])
def test_fused_engine_equals_loop_at_any_token_budget(kind, max_tokens):
    """Split batches (budget below one sample's tokens times the batch), one mixture a pass,
    and everything in one pass all give the loop's numbers."""
    from lmc_fast.sweep.batched import evaluate_batched
    from lmc_fast.sweep.per_point import evaluate_per_point
    from lmc_fast.sweep.interpolate import models_params

    a, b = make_model(kind, seed=5, dtype=torch.float32), make_model(kind, seed=6, dtype=torch.float32)
    arch, params = models_params([a, b], "canonical")
    data = classification_data(kind)
    W = [[1 - l, l] for l in (0.0, 0.3, 0.5, 1.0)]
    loop = evaluate_per_point(lf.to_canonical(a), params, W, data)
    fused = evaluate_batched(arch, params, W, data, chunk=3, max_tokens=max_tokens)
    for r, f in zip(loop, fused):
        for key in ("loss", "acc", "ece"):
            assert abs(r[key] - f[key]) <= 1e-5 * max(1.0, abs(r[key])), (key, r[key], f[key])
    with pytest.raises(ValueError, match="max_tokens"):
        evaluate_batched(arch, params, W, data, max_tokens=0)


@pytest.mark.parametrize("kind", ["vit", "gpt2"])
def test_barrier_endpoints_equal_separate_evaluation(kind):
    a, b = make_model(kind, seed=5, dtype=torch.float32), make_model(kind, seed=6, dtype=torch.float32)
    data = classification_data(kind)
    for space in ("canonical", "raw"):
        res = lf.barrier(a, b, data, 5, space=space)
        ea, eb = lf.evaluate(a, data), lf.evaluate(b, data)
        assert abs(res.loss[0] - ea["loss"]) < 1e-5 and abs(res.loss[-1] - eb["loss"]) < 1e-5
        assert res.acc[0] == pytest.approx(ea["acc"]) and res.acc[-1] == pytest.approx(eb["acc"])
        assert abs(res.signed[0]) < 1e-12 and abs(res.signed[-1]) < 1e-12
        assert res.barrier == pytest.approx(max(res.signed))
        if kind == "gpt2":
            assert res.ppl[0] == pytest.approx(math.exp(res.loss[0]))


def test_barrier_of_a_model_and_its_symmetric_copy_is_zero():
    a = make_model("vit", seed=7, dtype=torch.float32)
    from lmc_fast.symmetry import Alignment, canonical_spec

    arch, _ = standard_params(a)
    b = Alignment.random(canonical_spec(arch), seed=1).apply(a)
    data = classification_data("vit")
    naive = lf.barrier(a, b, data, 5, space="raw")
    aligned = lf.barrier(a, lf.align(a, b).apply(b), data, 5)
    assert max(abs(v) for v in naive.signed) > 1e-3  # the raw path leaves the function
    assert max(abs(v) for v in aligned.signed) < 1e-5  # the aligned path is the same function throughout
    json_text = aligned.to_json()
    assert '"barrier"' in json_text and '"lambdas"' in json_text


def test_barrier_accepts_one_shot_iterators():
    a, b = make_model("vit", seed=8, dtype=torch.float32), make_model("vit", seed=9, dtype=torch.float32)
    data = classification_data("vit")
    r1 = lf.barrier(a, b, iter(data), 3)
    r2 = lf.barrier(a, b, data, 3)
    assert r1.loss == pytest.approx(r2.loss)
    with pytest.raises(ValueError, match="no batches"):
        lf.barrier(a, b, [], 3)


def test_simplex_and_merge_many():
    models = [make_model("vit", seed=s, dtype=torch.float32) for s in range(3)]
    data = classification_data("vit")
    merged = lf.merge_many(models, "weight", rounds=3)
    assert len(merged) == 3
    x = make_inputs("vit", dtype=torch.float32)
    for m, orig in zip(merged, models):
        assert rel_err(logits(m, x), logits(orig, x)) < 1e-4  # aligned copies, same functions
    res = lf.simplex(merged, data, n=5, alpha=1.0, seed=0)
    assert len(res["samples"]) == 5
    assert res["centroid"]["weights"] == pytest.approx([1 / 3] * 3)
    for row, m in zip(res["models"], models):
        assert row["loss"] == pytest.approx(lf.evaluate(m, data)["loss"], rel=1e-5)
    assert res["worst"]["excess"] == max(s["excess"] for s in res["samples"])
    loop = lf.simplex(merged, data, n=5, alpha=1.0, seed=0, engine="loop")
    assert [s["loss"] for s in loop["samples"]] == pytest.approx([s["loss"] for s in res["samples"]], rel=1e-5)


def test_merge_many_planted_recovers_copies():
    base = make_model("gpt2", seed=10)
    arch, _ = standard_params(base)
    from lmc_fast.symmetry import Alignment, canonical_spec

    copies = [base] + [Alignment.random(canonical_spec(arch), seed=s).apply(base) for s in (1, 2)]
    merged = lf.merge_many(copies, "weight", mode="mean", rounds=5)
    ref = lf.to_canonical(base)
    for m in merged:
        for p1, p2 in zip(m.parameters(), ref.parameters()):
            assert torch.allclose(p1, p2, atol=1e-6)


@pytest.mark.parametrize("kind", ["vit", "gpt2"])
def test_mixtures_that_do_not_fit_together_run_in_blocks(kind):
    """With max_memory between one mixture's and all K's planned bytes, the batched engine
    plans blocks of mixtures (one pass over the data each) and returns the same numbers; it
    refuses only when one mixture does not fit."""
    from lmc_fast.sweep import checks
    from lmc_fast.sweep.batched import token_budget
    from lmc_fast.sweep.evaluate import EvalOptions, evaluate_mixtures
    from lmc_fast.sweep.interpolate import models_params

    a, b = make_model(kind, seed=5), make_model(kind, seed=6)  # float64: blocks must not change a digit
    arch, params = models_params([a, b], "canonical")
    data = classification_data(kind)
    W = [[1 - l, l] for l in (0.0, 0.1, 0.3, 0.5, 0.7, 1.0)]
    opts = EvalOptions(dtype=torch.float64, max_tokens=64)
    whole_plan, plan = {}, {}
    whole = evaluate_mixtures(arch, params, W, data, opts.replace(report=whole_plan))
    assert whole_plan["blocks"] == 1 and whole_plan["mixtures_per_block"] == 6
    budget = token_budget(64, "cpu")
    one, two = (checks.fused_sweep_bytes(arch, params[0], k, 2, torch.float64, budget) for k in (1, 2))
    blocks = evaluate_mixtures(arch, params, W, data, opts.replace(max_memory=two + 10, report=plan))
    assert plan == {"planned_bytes": two, "mixtures_per_block": 2, "blocks": 3}
    assert plan["planned_bytes"] < whole_plan["planned_bytes"]
    for r, g in zip(whole, blocks):
        for key in ("loss", "acc", "ece"):
            assert g[key] == pytest.approx(r[key], rel=1e-12, abs=1e-12), key
    with pytest.raises(ValueError, match="even one mixture does not fit"):
        evaluate_mixtures(arch, params, W, data, opts.replace(max_memory=one - 1))
    with pytest.raises(ValueError, match="max_memory must be"):
        evaluate_mixtures(arch, params, W, data, opts.replace(max_memory=0))


def test_barrier_and_simplex_take_max_memory_and_keep_their_numbers():
    """The public `max_memory`: a budget for about two mixtures splits the sweep into blocks,
    with the same numbers as one block (float64); a budget below one mixture is refused."""
    import lmc_fast as lf
    from lmc_fast.sweep import checks
    from lmc_fast.sweep.batched import token_budget
    from lmc_fast.sweep.interpolate import models_params

    a, b = make_model("vit", seed=5), make_model("vit", seed=6)
    data = classification_data("vit")
    arch, params = models_params([a, b], "canonical")
    two = checks.fused_sweep_bytes(arch, params[0], 2, 2, torch.float64, token_budget(64, "cpu"))
    whole = lf.barrier(a, b, data, 6, max_tokens=64)
    small = lf.barrier(a, b, data, 6, max_tokens=64, max_memory=two + 10)
    assert small.loss == pytest.approx(whole.loss, rel=1e-12, abs=1e-12)
    assert lf.simplex([a, b], data, n=3, max_tokens=64, max_memory=two + 10)["centroid"]["loss"] == pytest.approx(
        lf.simplex([a, b], data, n=3, max_tokens=64)["centroid"]["loss"], rel=1e-12)
    with pytest.raises(ValueError, match="even one mixture does not fit"):
        lf.barrier(a, b, data, 6, max_tokens=64, max_memory=1000)


def test_default_token_budget_depends_on_device_and_inputs():
    """The CPU default is 2k tokens a pass for token sequences, 8k for images (bench_sweep_load.py);
    CUDA has one default; a max_tokens given is kept whatever the inputs."""
    from lmc_fast.sweep.batched import MAX_TOKENS, MAX_TOKENS_SEQUENCES, token_budget

    assert token_budget(None, "cpu", "tokens") == MAX_TOKENS_SEQUENCES["cpu"] == 2048
    assert token_budget(None, "cpu", "patches") == token_budget(None, "cpu") == MAX_TOKENS["cpu"] == 8192
    assert token_budget(None, "cuda", "tokens") == token_budget(None, "cuda", "patches") == MAX_TOKENS["cuda"]
    assert token_budget(300, "cpu", "tokens") == token_budget(300, "cuda", "patches") == 300
