"""Hostile inputs: every one is refused with one line naming the bad value, or (for the
ignore index -100) handled the way Hugging Face handles it. Tiny models: the file runs in
seconds on one core."""
import math
import re
import time

import pytest
import torch
import torch.nn.functional as F

import lmc_fast as lf
from lmc_fast.models import GPT2, GPT2Config, ViT, ViTConfig
from lmc_fast.sweep.barrier import MAX_LAMBDAS, lambda_grid
from lmc_fast.sweep.metrics import MetricSums, evaluate, task_loss

VOCAB, BLOCK = 64, 16


def tiny(kind, seed=0):
    torch.manual_seed(seed)
    if kind == "vit":
        return ViT(ViTConfig.digits(d_model=16, n_layer=1, n_head=2, d_mlp=32)).eval()
    return GPT2(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=VOCAB, block_size=BLOCK)).eval()


def batch(kind, seed=0, B=6, T=10):
    gen = torch.Generator().manual_seed(seed)
    if kind == "vit":
        return torch.randn(B, 1, 8, 8, generator=gen), torch.randint(0, 10, (B,), generator=gen)
    x = torch.randint(0, VOCAB, (B, T), generator=gen)
    return x, x.clone()


def with_ignored(kind, seed=0):
    """A batch with about a third of its targets set to -100 (at least one kept, one ignored)."""
    x, y = batch(kind, seed)
    drop = torch.rand(y.shape, generator=torch.Generator().manual_seed(seed + 50)) < 0.35
    drop.view(-1)[-1], drop.view(-1)[-2] = True, False
    return x, y.masked_fill(drop, -100)


def reference(model, data):
    """Loss / accuracy over the kept positions, from F.cross_entropy(ignore_index=-100)."""
    lg, tg = [], []
    for x, y in data:
        out = model(x)
        if out.dim() == 3:
            out, y = out[:, :-1], y[:, 1:]
        lg.append(out.reshape(-1, out.shape[-1]).double())
        tg.append(y.reshape(-1))
    lg, tg = torch.cat(lg), torch.cat(tg)
    kept = tg != -100
    loss = F.cross_entropy(lg, tg, ignore_index=-100).item()
    acc = (lg.argmax(-1) == tg)[kept].double().mean().item()
    return loss, acc, int(kept.sum())


KINDS = ["vit", "gpt2"]


# ---------------------------------------------------------------- -100 labels


@pytest.mark.parametrize("kind", KINDS)
def test_task_loss_skips_ignored_targets(kind):
    model = tiny(kind)
    x, y = with_ignored(kind)
    logits = model(x)
    want, _, _ = reference(model, [(x, y)])
    assert abs(task_loss(logits, y).item() - want) < 1e-5
    nothing = task_loss(logits, torch.full_like(y, -100))
    assert nothing.item() == 0.0 and nothing.requires_grad  # backward still runs, moves nothing


@pytest.mark.parametrize("kind", KINDS)
def test_evaluate_and_metric_sums_skip_ignored_targets(kind):
    model = tiny(kind).double()
    data = [with_ignored(kind, s) for s in range(2)]
    data = [(x.double() if x.is_floating_point() else x, y) for x, y in data]
    loss, acc, n = reference(model, data)
    got = evaluate(model, data)
    assert abs(got["loss"] - loss) < 1e-10 and abs(got["acc"] - acc) < 1e-12
    sums = MetricSums(is_lm=kind == "gpt2")
    for x, y in data:
        sums.add(model(x), y)
    assert sums.n == n and sums.bin_n.sum().item() == n  # ECE bins count kept positions only


@pytest.mark.parametrize("engine", ["loop", "fused"])
@pytest.mark.parametrize("kind", KINDS)
def test_barrier_engines_skip_ignored_targets(kind, engine):
    a, b = tiny(kind, 1), tiny(kind, 2)
    data = [with_ignored(kind, s) for s in range(2)]
    res = lf.barrier(a, b, data, 3, engine=engine, space="raw")
    for model, loss_end, acc_end in ((a, res.loss_a, res.acc_a), (b, res.loss_b, res.acc_b)):
        loss, acc, _ = reference(model, data)
        assert abs(loss_end - loss) < 1e-5 and abs(acc_end - acc) < 1e-9


@pytest.mark.parametrize("engine", ["loop", "fused"])
def test_an_all_ignored_batch_contributes_nothing(engine):
    a, b = tiny("gpt2", 1), tiny("gpt2", 2)
    good = with_ignored("gpt2", 0)
    x, y = batch("gpt2", 9)
    ignored = (x, torch.full_like(y, -100))
    alone = lf.barrier(a, b, [good], 3, engine=engine, space="raw")
    mixed = lf.barrier(a, b, [good, ignored], 3, engine=engine, space="raw")
    assert alone.loss == mixed.loss and alone.acc == mixed.acc and alone.ece == mixed.ece


@pytest.mark.parametrize("where", ["evaluate", "loop", "fused"])
def test_an_all_ignored_evaluation_is_no_data(where):
    a, b = tiny("vit", 1), tiny("vit", 2)
    x, y = batch("vit")
    data = [(x, torch.full_like(y, -100))]
    with pytest.raises(ValueError, match=r"no data: every target of the 1 batch\(es\) is the ignore index -100"):
        if where == "evaluate":
            evaluate(a, data)
        else:
            lf.barrier(a, b, data, 3, engine=where, space="raw")


def test_training_skips_ignored_batches_and_refuses_all_ignored():
    from lmc_fast.train import train

    model = tiny("gpt2")
    x, y = batch("gpt2")
    ignored = (x, torch.full_like(y, -100))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match="every target of the 2 training batch"):
        train(model, [ignored], steps=2, progress=False, weight_decay=0.5)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())  # nothing moved
    hist = train(model, [with_ignored("gpt2"), ignored], steps=2, progress=False)
    assert math.isfinite(hist["train_loss"]) and hist["steps"] == 2


# ---------------------------------------------------------------- token ids and image shapes


def run_engine(engine, kind, data):
    a, b = tiny(kind, 1), tiny(kind, 2)
    if engine == "evaluate":
        return evaluate(a, data)
    if engine == "kernel":
        return lf.barrier(a, b, data, 3, engine="fused", kernel=True, space="raw")
    return lf.barrier(a, b, data, 3, engine=engine, space="raw")


@pytest.mark.parametrize("engine", ["evaluate", "loop", "fused"])
@pytest.mark.parametrize("bad", [-1, VOCAB, 10**12])
def test_out_of_range_input_ids_are_refused(engine, bad):
    x, y = batch("gpt2")
    x[1, 3] = bad
    with pytest.raises(ValueError, match=rf"token id {bad} is outside the vocabulary \[0, {VOCAB}\) \(vocab_size={VOCAB}\)"):
        run_engine(engine, "gpt2", [(x, y)])


def test_out_of_range_input_ids_are_refused_on_the_kernel_path():
    from lmc_fast.kernels.lerp_matmul import triton_available

    if not triton_available(torch.device("cpu")):
        pytest.skip("no Triton interpreter here")
    x, y = batch("gpt2")
    x[0, 0] = -1
    with pytest.raises(ValueError, match=r"token id -1 is outside the vocabulary"):
        run_engine("kernel", "gpt2", [(x, x)])


@pytest.mark.parametrize("engine", ["evaluate", "fused"])
@pytest.mark.parametrize("kind,bad", [("gpt2", -5), ("gpt2", VOCAB), ("vit", 10), ("vit", -1)])
def test_out_of_range_targets_are_refused_but_minus_100_is_not(engine, kind, bad):
    x, y = batch(kind)
    y.view(-1)[2] = bad
    y.view(-1)[3] = -100
    n_out = VOCAB if kind == "gpt2" else 10
    with pytest.raises(ValueError, match=rf"target .* {bad} is outside \[0, {n_out}\)"):
        run_engine(engine, kind, [(x, y)])


def test_too_long_sequences_are_refused():
    x = torch.randint(0, VOCAB, (2, BLOCK + 1))
    with pytest.raises(ValueError, match=f"sequence length {BLOCK + 1} exceeds the model's context of {BLOCK}"):
        run_engine("fused", "gpt2", [(x, x)])


@pytest.mark.parametrize("engine", ["evaluate", "fused"])
@pytest.mark.parametrize("shape", [(4, 3, 8, 8), (4, 1, 16, 16), (4, 1, 8, 6), (4, 4, 4, 4), (4, 64)])
def test_images_of_the_wrong_shape_are_refused(engine, shape):
    x, y = torch.randn(shape), torch.randint(0, 10, (4,))
    message = f"images of shape {tuple(shape)} do not fit the model, which takes (B, 1, 8, 8)"
    with pytest.raises(ValueError, match=re.escape(message)):
        run_engine(engine, "vit", [(x, y)])


def test_integer_images_are_refused():
    with pytest.raises(ValueError, match="images must be a floating-point tensor, got torch.uint8"):
        run_engine("fused", "vit", [(torch.zeros(2, 1, 8, 8, dtype=torch.uint8), torch.zeros(2, dtype=torch.long))])


# ---------------------------------------------------------------- simplex, interpolate, lambdas


@pytest.mark.parametrize("alpha", [-1, 0, float("nan"), float("inf"), "1"])
def test_simplex_refuses_bad_alpha(alpha):
    models = [tiny("vit", s) for s in range(3)]
    with pytest.raises(ValueError, match=rf"alpha \(the Dirichlet concentration\) must be a finite number > 0, got {alpha!r}"):
        lf.simplex(models, [batch("vit")], n=2, alpha=alpha)


@pytest.mark.parametrize("n", [0, -3, 2.5, True, 10**12])
def test_simplex_refuses_bad_sample_counts(n):
    models = [tiny("vit", s) for s in range(2)]
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=rf"n \(the number of Dirichlet samples\) must be an int in \[1, .*\], got {n!r}"):
        lf.simplex(models, [batch("vit")], n=n)
    assert time.perf_counter() - t0 < 5.0  # refused before any work (generous: CI machines are shared)


@pytest.mark.parametrize("weights,message", [
    ([float("nan"), 1.0], "finite numbers, got nan at position 0"),
    ([0.5, float("inf")], "finite numbers, got inf at position 1"),
    ([0.5, 0.6], r"sum to 1, got \[0.5, 0.6\] \(sum 1.1\)"),
    ([1.0], "got 2 models but 1 weights"),
    (["a", 1.0], "finite numbers, got 'a' at position 0"),
    (0.5, "a list of 2 numbers, got 0.5"),
])
def test_interpolate_refuses_bad_weights(weights, message):
    with pytest.raises(ValueError, match=message):
        lf.interpolate([tiny("vit", 1), tiny("vit", 2)], weights)


@pytest.mark.parametrize("lambdas,message", [
    (10**12, rf"a count must be an int in \[2, {MAX_LAMBDAS}\].*got 1000000000000"),
    (0, r"a count must be an int in \[2, .*got 0"),
    (1, r"a count must be an int in \[2, .*got 1"),
    (1e12, "a count \\(an int >= 2\\), a list of values in \\[0, 1\\] or .adaptive., got 1000000000000.0"),
    ([0.0, -0.5], r"finite values in \[0, 1\], got -0.5"),
    ([1.5], r"finite values in \[0, 1\], got 1.5"),
    ([0.2, float("nan")], r"finite values in \[0, 1\], got nan"),
    ([], r"between 1 and .* values, got 0"),
    (True, "got True"),
])
def test_barrier_refuses_bad_lambdas_at_once(lambdas, message):
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=message):
        lf.barrier(tiny("vit", 1), tiny("vit", 2), [batch("vit")], lambdas)
    assert time.perf_counter() - t0 < 5.0  # refused before any work (generous: CI machines are shared)


def test_lambda_grid_keeps_good_values():
    assert lambda_grid(3) == [0.0, 0.5, 1.0]
    assert lambda_grid([0, 1]) == [0.0, 1.0]
    assert len(lambda_grid(MAX_LAMBDAS)) == MAX_LAMBDAS


# ---------------------------------------------------------------- configs


VIT_BAD = [
    ({"n_layer": -1}, "ViTConfig.n_layer must be a positive int, got -1"),
    ({"d_model": 0}, "ViTConfig.d_model must be a positive int, got 0"),
    ({"n_head": 0}, "ViTConfig.n_head must be a positive int, got 0"),
    ({"d_mlp": 2.5}, "ViTConfig.d_mlp must be a positive int, got 2.5"),
    ({"channels": True}, "ViTConfig.channels must be a positive int, got True"),
    ({"num_classes": -2}, "ViTConfig.num_classes must be a positive int, got -2"),
    ({"d_model": 30, "n_head": 4}, "ViTConfig.d_model=30 is not divisible by n_head=4"),
    ({"patch_size": 3}, "image_size 8 is not divisible by patch_size 3"),
    ({"norm": "batchnorm"}, "ViTConfig.norm must be one of .*, got 'batchnorm'"),
    ({"activation": "relu"}, "ViTConfig.activation must be one of .*, got 'relu'"),
    ({"eps": 0}, "ViTConfig.eps must be a finite number > 0, got 0"),
    ({"eps": float("nan")}, "ViTConfig.eps must be a finite number > 0, got nan"),
    ({"eps": -1e-5}, "ViTConfig.eps must be a finite number > 0, got -1e-05"),
]
GPT2_BAD = [
    ({"n_layer": -1}, "GPT2Config.n_layer must be a positive int, got -1"),
    ({"n_embd": 0}, "GPT2Config.n_embd must be a positive int, got 0"),
    ({"n_head": 0}, "GPT2Config.n_head must be a positive int, got 0"),
    ({"vocab_size": 0}, "GPT2Config.vocab_size must be a positive int, got 0"),
    ({"block_size": "64"}, "GPT2Config.block_size must be a positive int, got '64'"),
    ({"d_mlp": -8}, "GPT2Config.d_mlp must be a positive int, got -8"),
    ({"n_embd": 30, "n_head": 4}, "GPT2Config.n_embd=30 is not divisible by n_head=4"),
    ({"norm": "LayerNorm"}, "GPT2Config.norm must be one of .*, got 'LayerNorm'"),
    ({"activation": "swish"}, "GPT2Config.activation must be one of .*, got 'swish'"),
    ({"eps": float("inf")}, "GPT2Config.eps must be a finite number > 0, got inf"),
]


@pytest.mark.parametrize("fields,message", VIT_BAD)
def test_vit_config_refuses_nonsense(fields, message):
    with pytest.raises(ValueError, match=message):
        ViTConfig.digits(**fields)


@pytest.mark.parametrize("fields,message", GPT2_BAD)
def test_gpt2_config_refuses_nonsense(fields, message):
    with pytest.raises(ValueError, match=message):
        GPT2Config(**fields)


@pytest.mark.parametrize("make", [
    lambda: ViT(ViTConfig(d_model=2**16, n_layer=2**12, n_head=2**4, d_mlp=2**18)),
    lambda: GPT2(GPT2Config(n_embd=2**14, vocab_size=2**40, n_head=2)),
])
def test_huge_configs_are_refused_before_allocating(make):
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=r"describes about [0-9.e+]+ parameters, more than the limit of 2\*\*34"):
        make()
    assert time.perf_counter() - t0 < 5.0  # no tensor of that size was ever asked for (that takes minutes or OOM)


def test_param_count_is_exact():
    for config, model in ((ViTConfig.digits(d_model=16, n_layer=1, n_head=2, d_mlp=32), ViT),
                          (GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=VOCAB, tie_word_embeddings=False), GPT2)):
        assert config.param_count() == sum(p.numel() for p in model(config).parameters())


# ---------------------------------------------------------------- sweep memory


@pytest.mark.parametrize("sweep", ["barrier", "simplex"])
def test_sweep_refuses_what_memory_cannot_hold(sweep, monkeypatch):
    from lmc_fast.models.adapters import standard_params
    from lmc_fast.sweep import checks

    monkeypatch.setattr(checks, "available_memory_bytes", lambda device: 10**6)
    models = [tiny("gpt2", s) for s in range(2)]
    arch, params = standard_params(models[0])
    # too many mixtures are split into blocks that fit: the refusal comes when even one does not,
    # at the max_tokens the user chose (a default budget shrinks to fit: the next test)
    budget = 8192
    need = checks.fused_sweep_bytes(arch, params, 1, 2, torch.float32, budget)
    message = (rf"sweep needs about {checks.format_gb(need)} \(K=1 mixtures of 2 models, max_tokens={budget}, float32\) "
               rf"but only 0.001 GB is available; use a smaller --max-tokens \(even one mixture does not fit\)")
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=message):
        if sweep == "barrier":
            lf.barrier(*models, [batch("gpt2")], 25, max_tokens=budget)
        else:
            lf.simplex(models, [batch("gpt2")], n=40, max_tokens=budget)
    assert time.perf_counter() - t0 < 5.0  # refused before any work (generous: CI machines are shared)
    # the default budget halves until one pass fits; below one sequence's pass it is refused too
    monkeypatch.setattr(checks, "available_memory_bytes", lambda device: 10**5)
    with pytest.raises(ValueError, match=r"even one mixture does not fit"):
        if sweep == "barrier":
            lf.barrier(*models, [batch("gpt2")], 25)
        else:
            lf.simplex(models, [batch("gpt2")], n=40)


def test_a_default_token_budget_shrinks_to_the_memory_a_user_has(monkeypatch):
    """With max_tokens left to the device default, a sweep that would not fit at that default runs
    in smaller passes (the same numbers as the budget chosen by hand), instead of being refused."""
    from lmc_fast.models.adapters import standard_params
    from lmc_fast.sweep import checks

    models = [tiny("gpt2", s) for s in range(2)]
    arch, params = standard_params(models[0])
    assert checks.fused_sweep_bytes(arch, params, 1, 2, torch.float32, 8192) > 10**6
    by_hand = lf.barrier(*models, [batch("gpt2")], 5, max_tokens=64)
    monkeypatch.setattr(checks, "available_memory_bytes", lambda device: 10**6)
    fitted = checks.fitted_token_budget(arch, params, 2, torch.float32, "cpu", 8192)
    assert 1 <= fitted < 8192 and checks.fused_sweep_bytes(arch, params, 1, 2, torch.float32, fitted) <= 10**6
    assert checks.fused_sweep_bytes(arch, params, 1, 2, torch.float32, 2 * fitted) > 10**6  # the largest that fits
    shrunk = lf.barrier(*models, [batch("gpt2")], 5)
    assert shrunk.loss == pytest.approx(by_hand.loss, rel=1e-6)
    assert checks.fitted_token_budget(arch, params, 2, torch.float32, "cpu", 64, max_memory=10**9) == 64


# ---------------------------------------------------------------- progress bars


@pytest.fixture
def bars(monkeypatch):
    """Every tqdm.auto.tqdm made during the test, silenced."""
    import tqdm.auto

    made = []

    class Recording(tqdm.auto.tqdm):
        def __init__(self, *args, **kw):
            super().__init__(*args, **{**kw, "disable": False, "file": open("/dev/null", "w")})
            made.append(self)

    monkeypatch.setattr(tqdm.auto, "tqdm", Recording)
    return made


@pytest.mark.parametrize("engine,max_batches,total", [("fused", None, 3), ("fused", 2, 2), ("loop", None, 4)])
def test_barrier_bar_has_a_total(bars, engine, max_batches, total):
    data = (batch("vit", s, B=2) for s in range(3))  # a one-shot iterator: materialised, so counted
    lf.barrier(tiny("vit", 1), tiny("vit", 2), data, [0.0, 0.3, 1.0, 0.6], engine=engine, space="raw",
               max_batches=max_batches, progress=True)
    assert len(bars) == 1 and bars[0].total == total and bars[0].n == total


@pytest.mark.parametrize("engine,total", [("fused", 2), ("loop", 2 + 1 + 3)])
def test_simplex_shows_progress(bars, engine, total):
    lf.simplex([tiny("vit", 1), tiny("vit", 2)], [batch("vit", s, B=2) for s in range(2)], n=3, engine=engine,
               space="raw", progress=True)
    assert len(bars) == 1 and bars[0].total == total and bars[0].n == total


def test_learned_matching_bar_ends_on_the_saved_best(bars):
    a, b = tiny("vit", 1), tiny("vit", 2)
    al = lf.align(a, b, "learned", data=[batch("vit", s, B=4) for s in range(3)], steps=6, eval_every=2, lr=0.05,
                  progress=True)
    (bar,) = [bar for bar in bars if bar.desc == "learned matching"]
    assert f"best_val_barrier={al.info['val_barrier']:.4f}" in bar.postfix
