"""Canonical form: function-preserving on every model type, idempotent, and of the stated shape."""
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lmc_fast as lf
from lmc_fast.models.adapters import standard_params
from lmc_fast.symmetry import canonical_params
from lmc_fast.symmetry.spec import norm_readers, residual_writers
from zoo import KINDS, logits, make_inputs, make_model, rel_err, tolerance


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-5)])
def test_canonical_preserves_function(kind, dtype, tol):
    m = make_model(kind, seed=1, dtype=dtype)
    x = make_inputs(kind, dtype=dtype)
    c = lf.to_canonical(m)
    assert type(c) is type(m)
    assert next(c.parameters()).dtype == dtype
    assert rel_err(logits(c, x), logits(m, x)) < tol


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(KINDS), n_layer=st.integers(1, 3), n_head=st.sampled_from([1, 2, 4]),
       d_mlp=st.integers(8, 40), seed=st.integers(0, 10_000))
def test_canonical_random_configs(kind, n_layer, n_head, d_mlp, seed):
    m = make_model(kind, seed=seed, n_layer=n_layer, n_head=n_head, d=8 * n_head, d_mlp=d_mlp)
    x = make_inputs(kind, seed=seed)
    assert rel_err(logits(lf.to_canonical(m), x), logits(m, x)) < 1e-10


@pytest.mark.parametrize("kind", ["vit", "gpt2"])
def test_canonical_rmsnorm(kind):
    m = make_model(kind, seed=2, norm="rmsnorm")
    x = make_inputs(kind)
    assert rel_err(logits(lf.to_canonical(m), x), logits(m, x)) < 1e-10


@pytest.mark.parametrize("kind", KINDS)
def test_canonical_structure_and_idempotence(kind):
    m = make_model(kind, seed=3)
    arch, raw = standard_params(m)
    p = canonical_params(arch, raw)
    for norm in norm_readers(arch):
        assert torch.equal(p[norm + ".weight"], torch.ones(arch.d_model, dtype=torch.float64))
    for l in range(arch.n_layer):
        if arch.qkv_bias and not arch.rotary:  # with RoPE, b_K is not a per-query constant
            assert p[f"blocks.{l}.attn.k.bias"].abs().max() == 0
        if arch.qkv_bias and arch.o_bias:  # b_V folds into b_O only where there is one
            assert p[f"blocks.{l}.attn.v.bias"].abs().max() == 0
        if arch.post_norm:  # the norms sit on the stream: nothing folds across them
            assert torch.equal(p[f"blocks.{l}.ln1.bias"], raw[f"blocks.{l}.ln1.bias"].double())
        elif arch.norm == "layernorm" and arch.qkv_bias:  # the shift folds into q / k / v's biases
            assert p[f"blocks.{l}.ln1.bias"].abs().max() == 0
        elif arch.norm == "layernorm":  # no biases to take it: the norm keeps c = beta / gamma
            assert p[f"blocks.{l}.ln1.bias"].abs().max() > 0.01
    if arch.norm == "layernorm" and not arch.post_norm:
        for name, axis in residual_writers(arch):  # pre-norm LayerNorm models: centred writers
            assert p[name].mean(dim=axis).abs().max() < 1e-12
    if arch.family in ("gpt2", "neox"):  # the LM head has no bias: its norm keeps c = beta / gamma
        assert p["ln_f.bias"].abs().max() > 0.01
        assert not torch.equal(p["lm_head.weight"], p["tok_embed.weight"])
    again = canonical_params(arch, p)
    assert max((again[k] - p[k]).abs().max().item() for k in p) < 1e-12


@pytest.mark.parametrize("kind", ["gpt2", "hf_gpt2", "hf_llama"])
def test_tied_language_models_export_untied(kind):
    m = make_model(kind, seed=4)
    assert m.config.tie_word_embeddings is True
    c = lf.to_canonical(m)
    assert c.config.tie_word_embeddings is False
    x = make_inputs(kind)
    assert rel_err(logits(c, x), logits(m, x)) < tolerance(kind, 1e-10)
    # HF stays HF and its LN weights are exactly one
    if kind == "hf_gpt2":
        assert torch.equal(c.transformer.ln_f.weight, torch.ones_like(c.transformer.ln_f.weight))


def test_tied_model_stays_tied_in_raw_space():
    m = make_model("gpt2", seed=5)
    arch, raw = standard_params(m)
    from lmc_fast.models.adapters import adapter_for

    rebuilt = adapter_for(m).build(m, raw)
    assert rebuilt.config.tie_word_embeddings
    assert rebuilt.lm_head.weight is rebuilt.tok_embed.weight


def test_near_zero_gamma_with_bias_is_refused():
    m = make_model("gpt2", seed=6)
    with torch.no_grad():
        m.ln_f.weight[3] = 0.0
        m.ln_f.bias[3] = 0.5
    with pytest.raises(ValueError, match="ln_f.*near zero"):
        lf.to_canonical(m)


def test_nan_weights_are_refused():
    m = make_model("vit", seed=7)
    with torch.no_grad():
        m.blocks[0].mlp.fc1.weight[0, 0] = float("nan")
    with pytest.raises(ValueError, match="blocks.0.mlp.fc1.weight.*NaN"):
        lf.to_canonical(m)


def test_unsupported_module_is_named():
    with pytest.raises(lf.UnsupportedModelError, match="Sequential"):
        lf.to_canonical(torch.nn.Sequential(torch.nn.Linear(2, 2)))
