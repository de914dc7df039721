"""diffusers' DiTTransformer2DModel through its adapter: the functional forward against diffusers' own `.sample`
(float64, to 1e-10), the exact round trip, conversion to the reference DiT, planted recovery by weight and
activation matching, barriers against `lf.evaluate`, and the refusals. Tiny models built from configs (no
downloads).

diffusers computes the timestep features in float32 (get_timestep_embedding: a float32 arange and
`timesteps.float()`); the fixture below lifts that cast, in this test only, with the same formula in float64, so
the comparisons measure the mapping rather than float32 rounding (about 1e-5 relative on these models: t up to
999 times each frequency, rounded to float32). Its fixed positions are float32 values too, but both sides read the
same buffer."""
from __future__ import annotations

import math
import re
from dataclasses import replace

import pytest
import torch

import lmc_fast as lf
from lmc_fast.models import DiT, DiTConfig
from lmc_fast.models import functional as Fn
from lmc_fast.models.adapters import UnsupportedModelError, adapter_for, check_compatible, standard_params
from lmc_fast.models.adapters.reference import RefDiTAdapter
from lmc_fast.models.functional_dit import pack_inputs
from lmc_fast.models.vit import patchify
from lmc_fast.sweep.checks import spec_from_model
from lmc_fast.symmetry import Alignment, canonical_params, canonical_spec

from test_dit import batches, scaled

diffusers = pytest.importorskip("diffusers")
embeddings = pytest.importorskip("diffusers.models.embeddings")

SIZES = dict(num_attention_heads=4, attention_head_dim=8, in_channels=1, num_layers=2, sample_size=8, patch_size=2,
             num_embeds_ada_norm=10)


@pytest.fixture(autouse=True)
def float64_timesteps(monkeypatch):
    """diffusers' timestep features without its float32 cast (the formula of get_timestep_embedding)."""
    def features(timesteps, embedding_dim, flip_sin_to_cos=False, downscale_freq_shift=1, scale=1, max_period=10000):
        half = embedding_dim // 2
        exponent = -math.log(max_period) * torch.arange(half, dtype=torch.float64) / (half - downscale_freq_shift)
        args = scale * timesteps[:, None].double() * torch.exp(exponent)[None]
        out = torch.cat([args.sin(), args.cos()], dim=-1)
        return torch.cat([out[:, half:], out[:, :half]], dim=-1) if flip_sin_to_cos else out

    monkeypatch.setattr(embeddings, "get_timestep_embedding", features)


def random_dit(seed=0, one_path=True, std=0.3, **overrides):
    """A diffusers DiT in float64, every parameter random (adaLN-Zero starts modulations and output at zero);
    with `one_path` every block's conditioning embedding set to block 0's, as in converted DiT checkpoints."""
    torch.manual_seed(seed)
    m = diffusers.DiTTransformer2DModel(**{**SIZES, **overrides}).double()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(std * torch.randn(p.shape, generator=g, dtype=torch.float64))
        if one_path:
            for block in m.transformer_blocks[1:]:
                block.norm1.emb.load_state_dict(m.transformer_blocks[0].norm1.emb.state_dict())
    return m.eval()


def inputs(channels=1, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(6, channels, 8, 8, generator=g, dtype=torch.float64)
    return pack_inputs(x, torch.tensor([0, 1, 17, 400, 998, 999]), torch.tensor([0, 3, 9, 10, 2, 10]))


def diffusers_noise(m, packed):
    """diffusers' own forward: `.sample`, its noise channels, in patchify's per-patch layout."""
    C = m.config.in_channels
    with torch.no_grad():
        sample = m(packed[:, :C], timestep=packed[:, C, 0, 0], class_labels=packed[:, C + 1, 0, 0].long()).sample
    assert sample.shape[1] == m.out_channels
    return patchify(sample[:, :C], m.config.patch_size)


def predict(arch, params, packed):
    return Fn.forward(arch, {k: v.unsqueeze(0) for k, v in params.items()}, packed)[0]


def rel(a, b):
    return float((a - b).detach().norm() / b.detach().norm())


# ------------------------------------------------------------------ the forward and the mapping
@pytest.mark.parametrize("overrides", [
    {},  # the released configuration: gelu-approximate, norm_eps 1e-5 on the MLP branch (1e-6 elsewhere)
    {"out_channels": 2, "attention_bias": False},  # learn_sigma (DiT-XL/2's variance channels), no q / k / v biases
    {"in_channels": 2, "activation_fn": "gelu", "norm_eps": 1e-6},  # exact GELU, one epsilon, two channels
])
def test_the_functional_forward_equals_diffusers(overrides):
    m = random_dit(**overrides)
    arch, params = standard_params(m)
    assert (arch.freq_dim, arch.freq_shift, arch.learn_sigma) == (256, 1, m.out_channels == 2 * m.config.in_channels)
    packed = inputs(m.config.in_channels)
    want = diffusers_noise(m, packed)
    assert rel(predict(arch, params, packed), want) < 1e-10
    assert rel(adapter_for(m).logits(m, packed), want) < 1e-10
    if arch.learn_sigma:  # the variance rows are kept in `out` (they read the stream) but not returned
        assert params["out.weight"].shape[0] == 2 * want.shape[-1]


def test_the_settings_that_differ_from_the_reference_dit_matter():
    """Each of the fields the adapter fills (the frequency shift, the MLP's epsilon, the output rows' order)
    changes the function when left at the reference DiT's value: the test above could not pass without them.
    Small weights and positions keep the stream's variance small, so that the epsilons show."""
    m = random_dit(std=0.05)
    with torch.no_grad():
        m.pos_embed.pos_embed.mul_(0.01)
    arch, params = standard_params(m)
    packed = inputs()
    want = diffusers_noise(m, packed)
    assert rel(predict(replace(arch, freq_shift=0), params, packed), want) > 1e-6
    assert rel(predict(arch, params, packed), want) < 1e-10
    assert rel(predict(replace(arch, mlp_eps=None), params, packed), want) > 1e-6
    m = random_dit(in_channels=2)  # with one channel (p, q, c) and (c, p, q) are the same order
    arch, params = standard_params(m)
    packed = inputs(2)
    unpermuted = {**params, "out.weight": m.proj_out_2.weight.detach(), "out.bias": m.proj_out_2.bias.detach()}
    assert rel(predict(arch, params, packed), diffusers_noise(m, packed)) < 1e-10
    assert rel(predict(arch, unpermuted, packed), diffusers_noise(m, packed)) > 1e-3


def test_the_round_trip_is_exact():
    m = random_dit(1, out_channels=2)
    ad = adapter_for(m)
    params = ad.get(m)
    b = ad.build(m, params)
    assert type(b) is type(m) and b is not m
    for (k, u), v in zip(m.state_dict().items(), b.state_dict().values()):
        assert torch.equal(u, v), k
    assert torch.equal(b.pos_embed.pos_embed, m.pos_embed.pos_embed)
    again = ad.get(b)
    assert all(torch.equal(again[k], params[k]) for k in params) and set(again) == set(params)
    with pytest.raises(ValueError, match="parameter 'pos_embed': shape .1, 32. does not fit .16, 32."):
        ad.build(m, {**params, "pos_embed": params["pos_embed"][:1]})
    # a moved model: the one conditioning path goes into every block
    g = Alignment.random(canonical_spec(ad.arch(m)), seed=2)
    moved = ad.build(m, g.apply_params(params))
    embs = [blk.norm1.emb.state_dict() for blk in moved.transformer_blocks]
    assert all(torch.equal(e[k], embs[0][k]) for e in embs[1:] for k in e)
    assert not torch.equal(embs[0]["timestep_embedder.linear_2.weight"],
                           m.transformer_blocks[0].norm1.emb.state_dict()["timestep_embedder.linear_2.weight"])


def test_converting_to_the_reference_dit_keeps_the_function():
    m = random_dit(2)
    arch, params = standard_params(m)
    c = m.config
    ref = DiT(DiTConfig(image_size=c.sample_size, patch_size=c.patch_size, channels=c.in_channels,
                        num_classes=c.num_embeds_ada_norm, d_model=arch.d_model, n_layer=arch.n_layer,
                        n_head=arch.n_head, d_mlp=arch.d_mlp, freq_dim=256, eps=1e-6, freq_shift=1,
                        mlp_eps=1e-5)).double()
    check_compatible(m, ref, mlp="equal")  # the Arch and the input / output sizes agree
    ours = RefDiTAdapter().build(ref, params).eval()
    packed = inputs()
    with torch.no_grad():
        assert rel(patchify(ours(packed), 2), diffusers_noise(m, packed)) < 1e-10
    back = adapter_for(m).build(m, standard_params(ours)[1])  # and back, exactly
    assert all(torch.equal(u, v) for u, v in zip(m.state_dict().values(), back.state_dict().values()))


def test_the_new_fields_round_trip_through_files_and_bad_values_are_refused(tmp_path):
    from dataclasses import asdict

    from lmc_fast.io import load_model, save_model
    from lmc_fast.models.arch import Arch

    arch = standard_params(random_dit(out_channels=2))[0]
    assert Arch.from_dict(asdict(arch)) == arch
    for key, value, message in (("freq_shift", 128, "freq_shift is 128"), ("mlp_eps", 2.0, "mlp_eps is 2.0"),
                                ("learn_sigma", 1, "learn_sigma is 1")):
        with pytest.raises(ValueError, match=message):
            Arch.from_dict({**asdict(arch), key: value})
    with pytest.raises(ValueError, match="freq_shift, mlp_eps and learn_sigma need conditioning 'adaln'"):
        Arch.from_dict({**asdict(Arch.vit(1, 8, 2, 16)), "learn_sigma": True})
    with pytest.raises(ValueError, match="DiTConfig.freq_shift must be None or an integer in"):
        DiTConfig(freq_dim=16, freq_shift=8)
    with pytest.raises(ValueError, match="DiTConfig.mlp_eps must be None or a float in"):
        DiTConfig(mlp_eps=0.0)
    ref = DiT(DiTConfig(freq_shift=1, mlp_eps=1e-5))  # a reference DiT holding diffusers' settings saves and loads
    back = load_model(save_model(ref, tmp_path / "ref"))
    assert back.config == ref.config and back.arch() == ref.arch() and ref.arch().freq_shift == 1


def test_the_input_spec_reads_the_diffusers_config():
    spec = spec_from_model(random_dit(3, in_channels=2))
    assert spec.denoise and spec.image_shape == (4, 8, 8) and spec.n_out == 10


# ------------------------------------------------------------------ matching and sweeps
def planted_pair(seed=5):
    """B = g . A (g in the whole group, with the modulation and gate scales), A with learn_sigma's variance rows:
    they read the stream, so the recovered alignment must move them too (the canonical comparison checks them)."""
    a = random_dit(seed, out_channels=2)
    arch, raw = standard_params(a)
    g = Alignment.random(canonical_spec(arch), seed=seed + 1)
    b = adapter_for(a).build(a, g.apply_params(scaled(arch, raw, seed + 2)))
    return a, b, g


@pytest.mark.parametrize("method", ["weight", "activation"])
def test_matching_recovers_a_planted_element_exactly(method):
    a, b, g = planted_pair()
    al = lf.align(a, b, method, **({"data": batches(3, 16)} if method == "activation" else {}))
    inverse = g.inverse()
    assert {"residual", "cond", "t_embed"} <= set(al.spec.groups)
    for name in al.spec.groups:
        assert torch.equal(al.elements[name]["perm"], inverse.elements[name]["perm"]), name
    arch = standard_params(a)[0]
    ca, cb = canonical_params(arch, standard_params(a)[1]), canonical_params(arch, standard_params(al.apply(b))[1])
    assert max(float((ca[k] - cb[k]).abs().max()) for k in ca) < 1e-9


def test_the_barrier_runs_and_its_endpoints_are_the_evaluated_models():
    a, b = random_dit(9), random_dit(10)
    data = batches()
    res = lf.barrier(a, b, data, lambdas=5)
    loop = lf.barrier(a, b, data, lambdas=5, engine="loop")  # builds each mixture as a diffusers model
    assert max(abs(x - y) for x, y in zip(res.loss, loop.loss)) < 1e-9
    assert res.loss_a == pytest.approx(lf.evaluate(a, data)["loss"], rel=1e-10, abs=0)
    assert res.loss_b == pytest.approx(lf.evaluate(b, data)["loss"], rel=1e-10, abs=0)
    assert res.acc_barrier is None  # the noise MSE has no accuracy


# ------------------------------------------------------------------ refusals, one line each
def _one_line(exc_info, pattern):
    text = str(exc_info.value)
    assert "\n" not in text and re.search(pattern, text), text


def test_blocks_with_their_own_conditioning_are_refused():
    with pytest.raises(UnsupportedModelError) as e:
        standard_params(random_dit(one_path=False))
    _one_line(e, r"block 1's conditioning embedding \(norm1\.emb\.timestep_embedder\.linear_1\.weight\) differs")


@pytest.mark.parametrize("make, pattern", [
    (lambda: random_dit(activation_fn="geglu"), r"activation_fn='geglu' is not supported"),
    (lambda: random_dit(out_channels=3), r"out_channels=3 with in_channels=1 is not supported"),
    (lambda: random_dit(norm_elementwise_affine=True), r"norm_elementwise_affine=True is not supported"),
    (lambda: _without_null_class(random_dit()), r"class_dropout_prob 0 has no null-class row"),
])
def test_unsupported_settings_are_refused(make, pattern):
    with pytest.raises(UnsupportedModelError) as e:
        standard_params(make())
    _one_line(e, pattern)


def _without_null_class(m):
    from diffusers.models.embeddings import LabelEmbedding

    for block in m.transformer_blocks:  # a class table without the null row (class_dropout_prob 0)
        block.norm1.emb.class_embedder = LabelEmbedding(10, m.inner_dim, 0.0).double()
    return m


def test_diffusers_folders_and_saves_are_refused_in_one_line(tmp_path):
    from lmc_fast.io import load_model, save_model

    m = random_dit()
    m.save_pretrained(tmp_path / "dit")
    with pytest.raises(UnsupportedModelError) as e:
        load_model(tmp_path / "dit")
    _one_line(e, r"a diffusers folder \('DiTTransformer2DModel'\) is not loaded from disk")
    with pytest.raises(UnsupportedModelError) as e:
        save_model(m, tmp_path / "ours")
    _one_line(e, r"cannot save DiTTransformer2DModel: diffusers models are mapped in memory only")
    assert not (tmp_path / "ours").exists()
