"""Stanford CRFM's GPT-2 seed suites are Hugging Face GPT-2s with two settings of their own:
`scale_attn_by_inverse_layer_idx` (block l's attention logits divided by l + 1 as well) and
`reorder_and_upcast_attn` (precision only). The first changes the function, so the forward reads it
(Arch.scale_by_layer); a gpt2-small-shaped folder as the Hub stores it loads, aligns and exports."""
from __future__ import annotations

import json
import warnings

import pytest
import torch

import lmc_fast as lf
from lmc_fast.io import load_model, save_model
from lmc_fast.models import functional as Fn
from lmc_fast.models.adapters import standard_params
from lmc_fast.symmetry import Alignment, canonical_spec
from zoo import logits, rel_err

transformers = pytest.importorskip("transformers")

CRFM = dict(scale_attn_by_inverse_layer_idx=True, reorder_and_upcast_attn=True)


def hf_gpt2(seed=0, n_layer=3, d=32, n_head=4, vocab=41, **overrides):
    cfg = transformers.GPT2Config(n_layer=n_layer, n_embd=d, n_head=n_head, vocab_size=vocab, n_positions=16,
                                  bos_token_id=0, eos_token_id=0, **overrides)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.manual_seed(seed)
        m = transformers.GPT2LMHeadModel(cfg)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # logits of order one, so that a wrong attention scale shows
        for name, p in m.named_parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=gen) + (1.0 if name.endswith("ln_1.weight") else 0.0))
    return m.double().eval()


@pytest.mark.parametrize("overrides", [CRFM, dict(scale_attn_weights=False), dict(CRFM, scale_attn_weights=False)])
def test_crfm_attention_settings_are_the_functional_forward(overrides):
    m = hf_gpt2(**overrides)
    arch, p = standard_params(m)
    x = torch.randint(0, 41, (2, 16), generator=torch.Generator().manual_seed(1))
    want = m(input_ids=x).logits
    assert (Fn.forward(arch, {k: v.unsqueeze(0) for k, v in p.items()}, x)[0] - want).abs().max() < 1e-9
    plain = hf_gpt2()  # the same weights read with the default scale differ: the setting is not a no-op
    plain.load_state_dict(m.state_dict())
    assert (plain(input_ids=x).logits - want).abs().max() > 1e-3


def test_a_crfm_pair_aligns_exactly_and_its_setting_is_compared():
    a = hf_gpt2(seed=3, **CRFM)
    truth = Alignment.random(canonical_spec(standard_params(a)[0]), seed=4)
    b = truth.apply(a)
    al = lf.align(a, b, "weight")
    x = torch.randint(0, 41, (2, 16), generator=torch.Generator().manual_seed(2))
    assert rel_err(logits(al.apply(b), x), logits(a, x)) < 1e-6
    with pytest.raises(ValueError, match="scale_attn_by_inverse_layer_idx"):
        lf.align(a, hf_gpt2(seed=5))


GPT2_SMALL = dict(activation_function="gelu_new", architectures=["GPT2LMHeadModel"], attn_pdrop=0.1, bos_token_id=50256,
                  embd_pdrop=0.1, eos_token_id=50256, initializer_range=0.02, layer_norm_epsilon=1e-05,
                  model_type="gpt2", n_ctx=1024, n_embd=768, n_head=12, n_layer=12, n_positions=1024,
                  resid_pdrop=0.1, summary_activation=None, summary_first_dropout=0.1, summary_proj_to_labels=True,
                  summary_type="cls_index", summary_use_proj=True, vocab_size=50257, **CRFM)


def _write_gpt2_folder(path, config: dict, seed: int):
    """A GPT-2 folder as the Hub has it: config.json with GPT-2's fields, one float16 safetensors file
    under the original names (no transformer. prefix), random weights written tensor by tensor."""
    from safetensors.torch import save_file

    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    d, L, V, T = config["n_embd"], config["n_layer"], config["vocab_size"], config["n_positions"]
    gen = torch.Generator().manual_seed(seed)
    rand = lambda *s: (0.02 * torch.randn(*s, generator=gen)).half()  # noqa: E731
    t = {"wte.weight": rand(V, d), "wpe.weight": rand(T, d), "ln_f.weight": (1 + rand(d).float()).half(),
         "ln_f.bias": rand(d)}
    for l in range(L):
        h = f"h.{l}."
        t.update({h + "ln_1.weight": (1 + rand(d).float()).half(), h + "ln_1.bias": rand(d),
                  h + "attn.c_attn.weight": rand(d, 3 * d), h + "attn.c_attn.bias": rand(3 * d),
                  h + "attn.c_proj.weight": rand(d, d), h + "attn.c_proj.bias": rand(d),
                  h + "ln_2.weight": (1 + rand(d).float()).half(), h + "ln_2.bias": rand(d),
                  h + "mlp.c_fc.weight": rand(d, 4 * d), h + "mlp.c_fc.bias": rand(4 * d),
                  h + "mlp.c_proj.weight": rand(4 * d, d), h + "mlp.c_proj.bias": rand(d)})
    save_file(t, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


@pytest.mark.slow
def test_a_gpt2_small_shaped_crfm_folder_loads_aligns_and_exports(tmp_path):
    """124M parameters each (the published gpt2-small shape with CRFM's settings): 93 s of one core and a
    5.8 GB peak here."""
    a, b = (load_model(_write_gpt2_folder(tmp_path / f"seed{s}", GPT2_SMALL, s)).float() for s in (1, 2))
    arch, _ = standard_params(a)
    assert arch.scale_by_layer and (arch.n_layer, arch.d_model, arch.n_head) == (12, 768, 12)
    al = lf.align(a, b, "weight", max_iter=2, dtype=torch.float32)
    aligned = al.apply(b)
    x = torch.randint(0, 50257, (1, 32), generator=torch.Generator().manual_seed(0))
    assert rel_err(logits(aligned, x), logits(b, x)) < 1e-3  # a symmetry of B, in float32
    save_model(aligned, tmp_path / "aligned")
    assert rel_err(logits(load_model(tmp_path / "aligned"), x), logits(aligned, x)) < 1e-6
