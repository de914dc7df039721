"""The LLaMA family: the reference Llama, Hugging Face's Llama / Mistral / Qwen2 through one adapter,
checkpoints, refusals, training and the CLI. Tiny configs; float64 where logits are compared (HF's
RMSNorm and rotary tables compute in float32 even in float64 models, hence atol 1e-5)."""
from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch

from lmc_fast.io import load_model, save_model
from lmc_fast.models import Llama, LlamaConfig
from lmc_fast.models.adapters import (HFLlamaAdapter, RefFunctionalAdapter, UnsupportedModelError, adapter_for,
                                      check_compatible)
from lmc_fast.models import functional as Fn

transformers = pytest.importorskip("transformers")

VOCAB, T = 41, 12
ATOL = 1e-5


def _randomise(model, seed: int):
    """Random weights everywhere (HF initialises norms to one and biases to zero)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float64).to(p.dtype)
            if name.endswith("norm.weight") or ".ln" in name or name.startswith("ln_f"):
                p.copy_(1 + 0.3 * noise)
            else:
                p.copy_(0.3 * noise)
    return model


def hf_model(cls: str, seed: int = 0, **overrides):
    base = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5, tie_word_embeddings=False)
    base.update(overrides)
    config = getattr(transformers, cls.replace("ForCausalLM", "Config"))(**base)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.manual_seed(seed)
        model = getattr(transformers, cls)(config)
    return _randomise(model.double().eval(), seed)


def ids(seed: int = 0, batch: int = 3, length: int = T, vocab: int = VOCAB):
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


def functional_logits(arch, params, x):
    return Fn.forward(arch, {k: v.unsqueeze(0) for k, v in params.items()}, x)[0]


# ---------------------------------------------------------------- (a) Hugging Face models through the adapter
HF_CASES = {
    "llama-mha": ("LlamaForCausalLM", dict(num_key_value_heads=4)),
    "llama-gqa": ("LlamaForCausalLM", dict(num_key_value_heads=2)),
    "llama-mqa-tied": ("LlamaForCausalLM", dict(num_key_value_heads=1, tie_word_embeddings=True)),
    "llama-attention-bias-mlp-bias": ("LlamaForCausalLM", dict(attention_bias=True, mlp_bias=True)),
    "llama-head-dim-12-theta-500": ("LlamaForCausalLM", dict(head_dim=12, rope_parameters={
        "rope_type": "default", "rope_theta": 500.0})),
    "mistral-gqa-window-4": ("MistralForCausalLM", dict(sliding_window=4)),
    "mistral-mqa-tied-full-attention": ("MistralForCausalLM", dict(num_key_value_heads=1, sliding_window=None,
                                                              tie_word_embeddings=True)),
    "qwen2-mha-biases": ("Qwen2ForCausalLM", dict(num_key_value_heads=4)),
    "qwen2-gqa-tied": ("Qwen2ForCausalLM", dict(tie_word_embeddings=True)),
    "qwen2-all-layers-window-5": ("Qwen2ForCausalLM", dict(use_sliding_window=True, sliding_window=5,
                                                           max_window_layers=0)),
}


@pytest.mark.parametrize("case", sorted(HF_CASES))
def test_hf_llama_family_matches_the_functional_forward(case):
    cls, overrides = HF_CASES[case]
    model = hf_model(cls, seed=len(case), **overrides)
    adapter = adapter_for(model)
    assert isinstance(adapter, HFLlamaAdapter)
    arch, params = adapter.arch(model), adapter.get(model)
    x = ids(1)
    with torch.no_grad():
        want = adapter.logits(model, x)
        got = functional_logits(arch, params, x)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)

    # the settings were read, not defaulted
    c = model.config
    assert (arch.n_head, arch.n_kv_head, arch.d_mlp) == (4, c.num_key_value_heads, 48)
    assert arch.qkv_bias == ("blocks.0.attn.q.bias" in params) and arch.o_bias == ("blocks.0.attn.o.bias" in params)
    assert arch.mlp_bias == ("blocks.0.mlp.fc1.bias" in params)
    if "window-" in case:
        assert arch.window is not None
        # the window matters at this length: the same weights without it compute something else
        full = functional_logits(dataclasses.replace(arch, window=None), params, x)
        assert (full - want).abs().max() > 1e-3
    else:
        assert arch.window is None
    if "theta-500" in case:
        assert arch.rope_theta == 500.0 and arch.head_dim == 12
    if cls == "Qwen2ForCausalLM":
        assert arch.qkv_bias and not arch.o_bias

    # build() gives back the same function and the same state dict (re-tied when the head is the embedding)
    rebuilt = adapter.build(model, params)
    assert type(rebuilt) is type(model)
    with torch.no_grad():
        torch.testing.assert_close(adapter.logits(rebuilt, x), want, atol=0, rtol=0)
    sd, sd2 = model.state_dict(), rebuilt.state_dict()
    assert sorted(sd) == sorted(sd2)
    assert all(torch.equal(sd[k], sd2[k]) for k in sd)
    tied = bool(c.tie_word_embeddings)
    assert (rebuilt.lm_head.weight is rebuilt.model.embed_tokens.weight) == tied


def test_hf_adapter_config_fields_and_compatibility():
    a, b = hf_model("LlamaForCausalLM", 0), hf_model("LlamaForCausalLM", 1)
    check_compatible(a, b)
    fields = HFLlamaAdapter().config_fields(a)
    assert fields["num_key_value_heads"] == 2 and fields["head_dim"] == 8 and fields["rope_theta"] == 10000.0
    narrow = hf_model("LlamaForCausalLM", 2, intermediate_size=40)
    check_compatible(a, narrow)  # a narrower MLP is zero-padded
    with pytest.raises(ValueError, match="num_key_value_heads"):
        check_compatible(a, hf_model("LlamaForCausalLM", 3, num_key_value_heads=1))
    with pytest.raises(ValueError, match="sliding_window"):
        check_compatible(hf_model("MistralForCausalLM", 0, sliding_window=4),
                         hf_model("MistralForCausalLM", 1, sliding_window=8))
    # across classes: the Arch plus the sizes (our Llama against HF's)
    ours = Llama(LlamaConfig(n_layer=2, d_model=32, n_head=4, n_kv_head=2, d_mlp=48, vocab_size=VOCAB,
                             block_size=64, eps=1e-5)).double()
    check_compatible(a, ours)
    assert HFLlamaAdapter().shape_fields(a) == RefFunctionalAdapter().shape_fields(ours)


# ---------------------------------------------------------------- (b) the reference Llama equals HF's
@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("cls, n_kv, qkv_bias", [("LlamaForCausalLM", 2, False), ("LlamaForCausalLM", 1, False),
                                                 ("Qwen2ForCausalLM", 4, True)])
def test_reference_llama_equals_hf(cls, n_kv, qkv_bias, tied):
    theta = 2000.0
    hf = hf_model(cls, seed=5, num_key_value_heads=n_kv, tie_word_embeddings=tied,
                  rope_parameters={"rope_type": "default", "rope_theta": theta})
    cfg = LlamaConfig(n_layer=2, d_model=32, n_head=4, n_kv_head=n_kv, d_mlp=48, vocab_size=VOCAB, block_size=64,
                      rope_theta=theta, eps=1e-5, qkv_bias=qkv_bias, tie_word_embeddings=tied)
    template = Llama(cfg).double().eval()
    assert adapter_for(template).arch(template) == adapter_for(hf).arch(hf)
    ours = RefFunctionalAdapter().build(template, HFLlamaAdapter().get(hf))
    assert (ours.lm_head.weight is ours.tok_embed.weight) == tied
    x = ids(2)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), hf(input_ids=x).logits, atol=ATOL, rtol=0)
    # and back: our parameters into HF's class
    back = HFLlamaAdapter().build(hf, RefFunctionalAdapter().get(ours))
    with torch.no_grad():
        torch.testing.assert_close(back(input_ids=x).logits, hf(input_ids=x).logits, atol=0, rtol=0)


def test_reference_llama_parameters_and_checks():
    m = Llama(LlamaConfig())
    names = set(dict(m.named_parameters(remove_duplicate=False)))
    assert {"tok_embed.weight", "blocks.1.ln1.weight", "blocks.1.ln2.weight", "blocks.1.attn.q.weight",
            "blocks.1.attn.k.weight", "blocks.1.attn.v.weight", "blocks.1.attn.o.weight", "blocks.1.mlp.gate.weight",
            "blocks.1.mlp.fc1.weight", "blocks.1.mlp.fc2.weight", "ln_f.weight", "lm_head.weight"} == \
        {n for n in names if not n.startswith("blocks.0.")}
    assert m.blocks[0].attn.k.weight.shape == (2 * 16, 64) and m.config.d_mlp == 172
    assert sum(p.numel() for p in m.parameters()) == m.config.param_count()
    tied = Llama(LlamaConfig(tie_word_embeddings=True, qkv_bias=True))
    assert tied.lm_head.weight is tied.tok_embed.weight
    assert sum(p.numel() for p in tied.parameters()) == tied.config.param_count()
    assert "lm_head.weight" in RefFunctionalAdapter().get(tied)
    with pytest.raises(ValueError, match="T<=64"):
        m(torch.zeros(1, 65, dtype=torch.long))
    for bad, match in ((dict(n_kv_head=3), "n_kv_head=3"), (dict(d_model=60, n_head=4, n_kv_head=2), "head_dim=15"),
                       (dict(n_layer=0), "n_layer"), (dict(eps=-1.0), "eps"),
                       (dict(rope_theta=float("nan")), "rope_theta"),
                       (dict(d_model=2**20, vocab_size=2**20), "limit"), (dict(d_model=30), "d_model=30")):
        with pytest.raises(ValueError, match=match):
            LlamaConfig(**bad)


# ---------------------------------------------------------------- (c) checkpoints
@pytest.mark.parametrize("tied", [False, True])
def test_reference_llama_checkpoint_round_trip(tmp_path, tied):
    torch.manual_seed(0)
    m = _randomise(Llama(LlamaConfig(n_layer=2, d_model=32, n_head=4, n_kv_head=2, vocab_size=VOCAB, block_size=16,
                                     tie_word_embeddings=tied, qkv_bias=True)), 0).eval()
    if tied:
        assert m.lm_head.weight is m.tok_embed.weight
    x = ids(3, length=16)
    for target in (tmp_path / "folder", tmp_path / "file.safetensors"):
        save_model(m, target, metadata={"seed": 7})
        loaded = load_model(target)
        assert isinstance(loaded, Llama) and loaded.config == m.config and loaded.lmc_fast_metadata == {"seed": 7}
        assert (loaded.lm_head.weight is loaded.tok_embed.weight) == tied
        with torch.no_grad():
            torch.testing.assert_close(loaded(x), m(x), atol=0, rtol=0)


@pytest.mark.parametrize("cls, overrides", [("LlamaForCausalLM", {}),
                                            ("LlamaForCausalLM", dict(tie_word_embeddings=True)),
                                            ("MistralForCausalLM", dict(sliding_window=4)),
                                            ("Qwen2ForCausalLM", dict(tie_word_embeddings=True))])
def test_hf_folder_round_trip(tmp_path, cls, overrides):
    hf = hf_model(cls, seed=4, **overrides)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf.save_pretrained(tmp_path / "pretrained")
    loaded = load_model(tmp_path / "pretrained")
    assert type(loaded) is type(hf) and next(loaded.parameters()).dtype == torch.float64
    x = ids(4)
    with torch.no_grad():
        want = hf(input_ids=x).logits
        torch.testing.assert_close(loaded(input_ids=x).logits, want, atol=0, rtol=0)
    # written back by save_model (an adapter-built model, as after a merge) and read again
    built = adapter_for(loaded).build(loaded, adapter_for(loaded).get(loaded))
    save_model(built, tmp_path / "again", metadata={"merged": True})
    again = load_model(tmp_path / "again")
    assert again.lmc_fast_metadata == {"merged": True}
    with torch.no_grad():
        torch.testing.assert_close(again(input_ids=x).logits, want, atol=0, rtol=0)


def test_hf_folder_with_bad_kv_heads_is_refused_before_loading(tmp_path):
    import json

    hf = hf_model("LlamaForCausalLM", 0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf.save_pretrained(tmp_path / "m")
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    cfg["num_key_value_heads"] = 3
    (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="num_key_value_heads") as info:
        load_model(tmp_path / "m")
    assert "\n" not in str(info.value)


# ---------------------------------------------------------------- (d) refusals
@pytest.mark.parametrize("cls, overrides, needle", [
    ("LlamaForCausalLM", dict(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}),
     "rope_type='linear'"),
    ("MistralForCausalLM", dict(rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}),
     "rope_type='dynamic'"),
    ("LlamaForCausalLM", dict(hidden_act="gelu"), "hidden_act='gelu'"),
    ("Qwen2ForCausalLM", dict(hidden_act="gelu"), "hidden_act='gelu'"),
    ("Qwen2ForCausalLM", dict(use_sliding_window=True, sliding_window=4, max_window_layers=1),
     "sliding window on 1 of 2 layers"),
])
def test_unmappable_settings_are_refused_in_one_line(cls, overrides, needle):
    model = hf_model(cls, 0, **overrides)
    adapter = adapter_for(model)
    for call in (adapter.arch, adapter.config_fields):
        with pytest.raises(UnsupportedModelError) as info:
            call(model)
        text = str(info.value)
        assert needle in text and "\n" not in text and cls in text


def test_adapter_for_names_the_llama_family():
    with pytest.raises(UnsupportedModelError, match="lmc_fast.models.Llama, .*transformers.LlamaForCausalLM, "
                       "transformers.MistralForCausalLM(,| and) transformers.Qwen2ForCausalLM"):
        adapter_for(torch.nn.Linear(2, 2))


# ---------------------------------------------------------------- (e) training
def test_llama_trains():
    from lmc_fast.data.base import TokenDataset
    from lmc_fast.sweep.metrics import task_loss
    from lmc_fast.train import seed_everything, train

    seed_everything(0)
    model = Llama(LlamaConfig(n_layer=2, d_model=32, n_head=4, n_kv_head=2, vocab_size=VOCAB, block_size=16))
    data = TokenDataset(ids(5, batch=8, length=16), VOCAB)

    def loss():
        with torch.no_grad():
            return task_loss(model(data.ids), data.ids).item()

    before = loss()
    hist = train(model, data, steps=20, batch_size=8, lr=1e-2, warmup=0.1, progress=False)
    assert hist["steps"] == 20
    assert loss() < before - 0.3, (before, loss())


def test_hf_llama_trains_through_its_adapter():
    from lmc_fast.data.base import TokenDataset
    from lmc_fast.train import train

    model = hf_model("LlamaForCausalLM", 0).float().train()
    _randomise(model, 0)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(0.1)
    data = TokenDataset(ids(6, batch=8, length=16), VOCAB)
    hist = train(model, data, steps=20, batch_size=8, lr=1e-2, warmup=0.1, progress=False, eval_data=data)
    assert hist["eval"]["loss"] < hist["loss_curve"][0]


# ---------------------------------------------------------------- CLI and recipe
def test_cli_trains_a_llama_on_text(tmp_path, capsys):
    from lmc_fast.cli import main

    text = tmp_path / "t.txt"
    text.write_text("".join(f"line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(40)))
    rc = main(["train", "--model", "llama", "--data", f"text:{text}", "--seeds", "0", "--steps", "2",
               "--block-size", "16", "--out", str(tmp_path / "l"), "-q",
               "--config", "n_layer=1", "d_model=16", "n_head=2", "n_kv_head=1", "tie_word_embeddings=true"])
    assert rc == 0, capsys.readouterr().err
    m = load_model(tmp_path / "l" / "seed0")
    assert isinstance(m, Llama) and m.config.block_size == 16 and m.config.d_model == 16
    assert m.config.d_mlp == 44 and m.config.head_dim == 8 and m.lm_head.weight is m.tok_embed.weight
    rc = main(["train", "--model", "llama", "--data", f"text:{text}", "--out", str(tmp_path / "x"), "-q",
               "--config", "vocab_size=3"])
    assert rc == 2 and "vocab_size is set by" in capsys.readouterr().err


def test_llama_recipe():
    from lmc_fast.grid.spec import RECIPE_DATA
    from lmc_fast.recipes import NAMES, recipe

    assert "llama-shakespeare" in NAMES and RECIPE_DATA["llama-shakespeare"] == "shakespeare"
    r = recipe("llama-shakespeare", steps=5)
    m = r.model(seed=0)
    assert isinstance(m, Llama) and m.config.n_kv_head == 2 and r.hparams["steps"] == 5
    assert recipe("llama-shakespeare").measured.get("seconds", 0) > 0
