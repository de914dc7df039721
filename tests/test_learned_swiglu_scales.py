"""bench/learned_swiglu_scales.py: the unit scales it learns are exact symmetries of a SwiGLU model (float64),
factor 0 is the library's loop step for step, and a non-zero factor lets the scales move."""
import sys
from pathlib import Path

import pytest
import torch

from lmc_fast.match import learned as L
from lmc_fast.models import functional as Fn
from lmc_fast.models import GPT2, GPT2Config

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import learned_swiglu_scales as lss  # noqa: E402
from test_rotary_gap import T, VOCAB, tiny_llama, tokens  # noqa: E402


def test_scaled_units_keep_the_function_in_float64():
    la = lss.ScaledAlignment(tiny_llama(0), tiny_llama(1), "identity", factor=1.0)
    pb = la.params_list[1]
    g = torch.Generator().manual_seed(3)
    s = [torch.exp(torch.randn(pb["blocks.0.mlp.fc1.weight"].shape[0], generator=g, dtype=torch.float64))
         for _ in range(la.arch.n_layer)]
    x = tokens(5, 1)[0][0]
    stack = lambda p: {k: v.unsqueeze(0) for k, v in p.items()}  # noqa: E731
    before = Fn.forward(la.arch, stack(pb), x)
    moved = lss.scaled_units(pb, la.arch.n_layer, s)
    after = Fn.forward(la.arch, stack(moved), x)
    assert not torch.equal(moved["blocks.0.mlp.fc1.weight"], pb["blocks.0.mlp.fc1.weight"])
    torch.testing.assert_close(after, before, rtol=0, atol=1e-10)


def _fit(module, data):
    train, val = data[:-1], data[-1:]
    return L.fit_alignments(module, train, val, steps=6, lr=0.01, lam="uniform", lambdas_per_step=1, eval_every=3,
                            patience=6, seed=0, target="labels", weight_decay=0.01, warmup=0.05, clip=1.0)


def test_factor_zero_is_the_librarys_loop_and_a_factor_moves_the_scales():
    a, b, data = tiny_llama(0), tiny_llama(1), tokens(7)
    plain_hard, plain_info = _fit(L.LearnedAlignment(a, b, "identity"), data)
    fixed = lss.ScaledAlignment(a, b, "identity", factor=0.0)
    hard, info = _fit(fixed, data)
    assert info["val_history"] == plain_info["val_history"]
    for name, el in plain_hard[0].items():
        for key, value in el.items():
            assert torch.equal(hard[0][name][key], value), (name, key)
    moving = lss.ScaledAlignment(a, b, "identity", factor=1.0)
    _fit(moving, data)
    assert moving.log_scale.detach().abs().max() > 1e-3


def test_a_model_without_a_gated_mlp_is_refused_in_one_line():
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=VOCAB, block_size=T)
    with pytest.raises(SystemExit, match="not gated"):
        lss.ScaledAlignment(GPT2(cfg).eval(), GPT2(cfg).eval(), "identity", factor=1.0)
