"""The LLaMA family's symmetry group on standard parameters (float64): RMSNorm folded, residual O(d),
SwiGLU unit permutations, grouped-query heads (key / value heads with their query heads, query heads
within a group), QK maps that commute with RoPE, VO maps per key / value head.

Every transformation is checked against the one functional forward; every solver on a planted case
(apply a random element, align back, recover it exactly) for multi-head, grouped-query and multi-query
attention, with and without q/k/v biases (Qwen2) and o biases (Llama's attention_bias).
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

from lmc_fast.match.activation import activation_matching
from lmc_fast.match.projection import Latents, apply_dense
from lmc_fast.match.weight import weight_matching
from lmc_fast.models.arch import Arch
from lmc_fast.models import functional as Fn
from lmc_fast.symmetry import elements as E
from lmc_fast.symmetry.canonical import canonical_params
from lmc_fast.symmetry.spec import canonical_spec, permutation_spec

VOCAB = 40
#: (n_kv_head, q/k/v biases, o bias): MHA, GQA, MQA, Qwen2-like, Llama attention_bias=True
CONFIGS = [(4, False, False), (2, False, False), (1, False, False), (2, True, False), (4, True, True)]
IDS = ["mha", "gqa", "mqa", "gqa-qkv-bias", "mha-all-bias"]


def llama_arch(n_kv: int, qkv_bias: bool, o_bias: bool, **kw) -> Arch:
    return Arch.llama(2, 32, 4, 48, n_kv_head=n_kv, qkv_bias=qkv_bias, o_bias=o_bias, **kw)


def random_params(arch: Arch, seed: int = 0) -> dict:
    """Standard parameters of a LLaMA-family arch, float64, norm weights away from one."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64)  # noqa: E731
    d, H, G, dh, f = arch.d_model, arch.n_head, arch.n_kv_head, arch.head_dim, arch.d_mlp
    p = {"tok_embed.weight": r(VOCAB, d), "ln_f.weight": 1 + 0.2 * r(d), "lm_head.weight": r(VOCAB, d) / d**0.5}
    for l in range(arch.n_layer):
        b = f"blocks.{l}."
        p[b + "ln1.weight"], p[b + "ln2.weight"] = 1 + 0.2 * r(d), 1 + 0.2 * r(d)
        p[b + "attn.q.weight"], p[b + "attn.o.weight"] = r(H * dh, d) / d**0.5, r(d, H * dh) / d**0.5
        p[b + "attn.k.weight"], p[b + "attn.v.weight"] = r(G * dh, d) / d**0.5, r(G * dh, d) / d**0.5
        if arch.qkv_bias:
            p[b + "attn.q.bias"], p[b + "attn.k.bias"], p[b + "attn.v.bias"] = 0.3 * r(H * dh), 0.3 * r(G * dh), 0.3 * r(G * dh)
        if arch.o_bias:
            p[b + "attn.o.bias"] = 0.3 * r(d)
        p[b + "mlp.gate.weight"], p[b + "mlp.fc1.weight"] = r(f, d) / d**0.5, r(f, d) / d**0.5
        p[b + "mlp.fc2.weight"] = r(d, f) / f**0.5
    return p


def logits(arch: Arch, params: dict, ids: torch.Tensor) -> torch.Tensor:
    return Fn.forward(arch, {k: v.unsqueeze(0) for k, v in params.items()}, ids)[0]


def max_diff(a: dict, b: dict) -> float:
    return max((a[k] - b[k]).abs().max().item() for k in a)


@pytest.fixture
def ids():
    return torch.randint(0, VOCAB, (3, 12), generator=torch.Generator().manual_seed(5))


@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
def test_canonical_form_keeps_the_function_and_is_idempotent(config, ids):
    arch = llama_arch(*config)
    p = random_params(arch)
    c = canonical_params(arch, p)
    assert (logits(arch, c, ids) - logits(arch, p, ids)).abs().max() < 1e-10
    assert max_diff(canonical_params(arch, c), c) < 1e-12
    assert all(torch.equal(c[n + ".weight"], torch.ones(arch.d_model, dtype=torch.float64))
               for n in ["ln_f"] + [f"blocks.{l}.ln{i}" for l in range(2) for i in (1, 2)])
    if arch.qkv_bias:  # rotary: q . R(n - m) b_K depends on the key's position, so b_K stays
        assert c["blocks.0.attn.k.bias"].abs().max() > 0
    if arch.o_bias:  # b_V folded into b_O (attention rows sum to one)
        assert torch.equal(c["blocks.0.attn.v.bias"], torch.zeros_like(c["blocks.0.attn.v.bias"]))


@pytest.mark.parametrize("head_map", ["orthogonal", "invertible"])
@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
def test_every_group_element_keeps_the_function(config, head_map, ids):
    arch = llama_arch(*config)
    c = canonical_params(arch, random_params(arch))
    spec = canonical_spec(arch, head_map)
    heads = spec.groups["heads.0"]
    assert (heads.kv_heads, heads.group_size, heads.rotary) == (arch.n_kv_head, 4 // arch.n_kv_head, True)
    g = torch.Generator().manual_seed(1)
    els = {n: E.random_element(group, g) for n, group in spec.groups.items()}
    for n, group in spec.groups.items():
        E.validate(group, els[n])
    moved = E.apply_spec(spec, c, els)
    assert max_diff(moved, c) > 0.1  # it did move the parameters
    assert (logits(arch, moved, ids) - logits(arch, c, ids)).abs().max() < 1e-10
    # the raw-space group (whole heads, residual permutation with the norm weights) too
    raw = random_params(arch)
    pspec = permutation_spec(arch)
    pels = {n: E.random_element(group, g) for n, group in pspec.groups.items()}
    assert (logits(arch, E.apply_spec(pspec, raw, pels), ids) - logits(arch, raw, ids)).abs().max() < 1e-10


@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
def test_inverse_and_compose_agree_with_applying(config):
    arch = llama_arch(*config)
    c = canonical_params(arch, random_params(arch))
    spec = canonical_spec(arch, "invertible")
    g = torch.Generator().manual_seed(2)
    first, second = ({n: E.random_element(group, g) for n, group in spec.groups.items()} for _ in range(2))
    twice = E.apply_spec(spec, E.apply_spec(spec, c, second), first)
    composed = {n: E.compose(group, first[n], second[n]) for n, group in spec.groups.items()}
    assert max_diff(E.apply_spec(spec, c, composed), twice) < 1e-10
    inverse = {n: E.inverse(group, first[n]) for n, group in spec.groups.items()}
    assert max_diff(E.apply_spec(spec, E.apply_spec(spec, c, first), inverse), c) < 1e-10


def test_a_general_qk_map_breaks_rope_and_is_refused(ids):
    """Why the QK maps are per-plane rotations: a full orthogonal map (fine without RoPE) or a
    rotation of interleaved pairs changes a rotary model's function, and validation names it."""
    arch = llama_arch(4, False, False)
    c = canonical_params(arch, random_params(arch))
    spec = canonical_spec(arch)
    group = spec.groups["heads.0"]
    g = torch.Generator().manual_seed(3)
    el = E.identity(group)
    el["qk"] = E.random_orthogonal(arch.head_dim, g, batch=(4,))
    moved = E.apply_spec(spec, c, {"heads.0": el})
    assert (logits(arch, moved, ids) - logits(arch, c, ids)).abs().max() > 1e-3
    with pytest.raises(E.InvalidAlignmentError, match="does not commute with the rotary positions"):
        E.validate(group, el)
    # interleaved planes (2i, 2i + 1), the other common RoPE layout: also not a symmetry here
    angle = torch.rand(arch.head_dim // 2, generator=g, dtype=torch.float64) * 6.28
    inter = torch.zeros(arch.head_dim, arch.head_dim, dtype=torch.float64)
    for i, a in enumerate(angle):
        inter[2 * i:2 * i + 2, 2 * i:2 * i + 2] = torch.tensor([[a.cos(), -a.sin()], [a.sin(), a.cos()]])
    el["qk"] = inter.expand(4, -1, -1).clone()
    moved = E.apply_spec(spec, c, {"heads.0": el})
    assert (logits(arch, moved, ids) - logits(arch, c, ids)).abs().max() > 1e-3


def test_a_gqa_axis_reshaped_as_mha_is_caught(ids):
    """The silent-corruption case: a GQA key / value axis treated as n_head blocks. Elements then have the
    wrong shapes (refused), and the same map read as multi-head attention changes the function."""
    arch = llama_arch(2, False, False)
    c = canonical_params(arch, random_params(arch))
    spec = canonical_spec(arch)
    group = spec.groups["heads.0"]
    as_mha = dataclasses.replace(group, n_kv_heads=0)
    el = E.random_element(as_mha, torch.Generator().manual_seed(4))
    with pytest.raises(E.InvalidAlignmentError, match="lacks \\['qperm'\\]"):
        E.validate(group, el)
    with pytest.raises(E.InvalidAlignmentError, match="'perm' has shape \\(4,\\), expected \\(2,\\)"):
        E.validate(group, {**el, "qperm": torch.zeros(2, 2, dtype=torch.long)})
    wrong = dataclasses.replace(spec, groups={**spec.groups, "heads.0": as_mha})
    # K's 16 rows would reshape as 4 heads x 8 without complaint: the axis length is checked instead
    with pytest.raises(E.InvalidAlignmentError, match="attn.k.weight axis 0 has 16 entries, not 4 heads x 8"):
        E.apply_spec(wrong, c, {"heads.0": el})


def test_grouped_elements_are_validated():
    arch = llama_arch(2, False, False)
    group = canonical_spec(arch).groups["heads.0"]
    el = E.random_element(group, torch.Generator().manual_seed(6))
    assert el["qperm"].shape == (2, 2) and el["qk"].shape == (2, 8, 8)
    bad = {**el, "qperm": torch.tensor([[0, 0], [1, 0]])}
    with pytest.raises(E.InvalidAlignmentError, match="qperm\\[0\\]' is not a bijection"):
        E.validate(group, bad)
    with pytest.raises(E.InvalidAlignmentError, match="lacks \\['qperm'\\]"):
        E.validate(group, {k: v for k, v in el.items() if k != "qperm"})


def _planted(arch: Arch, spec, seed: int = 1):
    pa = random_params(arch) if spec.space == "raw" else canonical_params(arch, random_params(arch))
    g = torch.Generator().manual_seed(seed)
    planted = {n: E.random_element(group, g) for n, group in spec.groups.items()}
    return pa, E.apply_spec(spec, pa, planted), {n: E.inverse(group, planted[n]) for n, group in spec.groups.items()}


def _assert_recovered(spec, pa, pb, found, want):
    assert max_diff(E.apply_spec(spec, pb, found), pa) < 1e-9
    for n, el in want.items():
        for key in ("perm", "qperm"):
            if key in el:
                assert torch.equal(found[n][key], el[key]), (n, key)
        for key in ("qk", "vo", "matrix"):
            if key in el:
                assert (found[n][key] - el[key]).abs().max() < 1e-9, (n, key)


@pytest.mark.parametrize("space", ["canonical", "raw"])
@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
def test_weight_matching_recovers_a_planted_symmetry(config, space):
    arch = llama_arch(*config)
    spec = canonical_spec(arch) if space == "canonical" else permutation_spec(arch)
    pa, pb, want = _planted(arch, spec)
    found, info = weight_matching(spec, pa, pb)
    _assert_recovered(spec, pa, pb, found, want)
    assert info["iterations"] <= 5


@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
def test_activation_matching_recovers_a_planted_symmetry(config):
    arch = llama_arch(*config)
    spec = canonical_spec(arch)
    pa, pb, want = _planted(arch, spec)
    gen = torch.Generator().manual_seed(7)
    data = [(torch.randint(0, VOCAB, (8, 16), generator=gen), None) for _ in range(3)]
    found, _ = activation_matching(spec, pa, pb, data)
    _assert_recovered(spec, pa, pb, found, want)


@pytest.mark.parametrize("head_map", ["orthogonal", "invertible"])
@pytest.mark.parametrize("config", CONFIGS[:3], ids=IDS[:3])
def test_learned_latents_project_to_the_elements_they_start_from(config, head_map):
    """Learned matching's dense, differentiable action equals the exact one, and its hard projection
    of a start element is that element (grouped perms, rotary QK maps included)."""
    arch = llama_arch(*config)
    spec = canonical_spec(arch, head_map)
    c = canonical_params(arch, random_params(arch))
    els = {n: E.random_element(group, torch.Generator().manual_seed(8)) for n, group in spec.groups.items()}
    dense, hard = Latents(spec, els, torch.float64).project()
    assert max_diff(apply_dense(spec, c, dense), E.apply_spec(spec, c, els)) < 1e-10
    for n, el in els.items():
        for key, t in el.items():
            assert (hard[n][key].double() - t.double()).abs().max() < 1e-10, (n, key)


def test_rope_matches_complex_rotation():
    """Our rotary tables rotate plane (p, p + d/2) of position m by m * theta^(-2p/d)."""
    arch = llama_arch(4, False, False, rope_theta=500.0)
    T, dh = 7, arch.head_dim
    x = torch.randn(T, dh, dtype=torch.float64)
    cos, sin = Fn.rope_tables(arch, T, torch.float64, "cpu")
    got = Fn.apply_rope(x, cos, sin)
    z = torch.complex(x[:, : dh // 2], x[:, dh // 2:])
    freq = 500.0 ** (-torch.arange(0, dh, 2, dtype=torch.float64) / dh)
    want = z * torch.polar(torch.ones(T, dh // 2, dtype=torch.float64), torch.arange(T)[:, None] * freq)
    assert torch.allclose(got, torch.cat([want.real, want.imag], -1), atol=1e-12)


def test_sliding_window_limits_what_a_query_sees(ids):
    arch = llama_arch(2, False, False, window=3)
    p = random_params(arch)
    full = logits(llama_arch(2, False, False), p, ids)
    windowed = logits(arch, p, ids)
    assert torch.allclose(windowed[:, :3], full[:, :3], atol=1e-12)  # the first 3 positions see everything
    assert (windowed[:, 3:] - full[:, 3:]).abs().max() > 1e-6
    changed = ids.clone()
    changed[:, 0] = (changed[:, 0] + 1) % VOCAB  # position 0 is outside position 5's window of 3
    assert torch.allclose(logits(arch, p, changed)[:, 5:], windowed[:, 5:], atol=1e-12)


def test_arch_files_from_before_the_llama_fields_still_load():
    old = {"family": "gpt2", "n_layer": 2, "d_model": 64, "n_head": 4, "d_mlp": 256, "norm": "layernorm",
           "eps": 1e-5, "activation": "gelu_tanh"}
    arch = Arch.from_dict(old)
    assert (arch.inputs, arch.positions, arch.causal, arch.n_kv_head, arch.qkv_bias) == ("tokens", "learned", True, 4,
                                                                                          True)
    new = llama_arch(2, True, False, window=16)
    assert Arch.from_dict(dataclasses.asdict(new)) == new
    with pytest.raises(ValueError, match="n_head 4 is not a multiple of n_kv_head 3"):
        Arch.from_dict({**dataclasses.asdict(new), "n_kv_head": 3})
    with pytest.raises(ValueError, match="arch positions is 'alibi'"):
        Arch.from_dict({**dataclasses.asdict(new), "positions": "alibi"})


def _scaled_units(arch: Arch, params: dict, scales: list) -> dict:
    """SwiGLU's scale symmetry on standard parameters: unit i's up row (and bias) times s_i, its down
    column over s_i, per layer."""
    out = dict(params)
    for l, s in enumerate(scales):
        b = f"blocks.{l}.mlp."
        out[b + "fc1.weight"] = params[b + "fc1.weight"] * s[:, None]
        if b + "fc1.bias" in params:
            out[b + "fc1.bias"] = params[b + "fc1.bias"] * s
        out[b + "fc2.weight"] = params[b + "fc2.weight"] / s[None, :]
    return out


def _log_uniform_scales(arch: Arch, seed: int, low: float = 0.25, high: float = 4.0) -> list:
    g = torch.Generator().manual_seed(seed)
    lo, hi = torch.log(torch.tensor(low)), torch.log(torch.tensor(high))
    return [torch.exp(lo + (hi - lo) * torch.rand(arch.d_mlp, generator=g, dtype=torch.float64))
            for _ in range(arch.n_layer)]


@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
def test_unit_scales_keep_the_function_and_the_canonical_form(config, ids):
    """Scales in [1/4, 4] leave the logits as they are (float64), and the canonical form balances them
    away: both models' canonical parameters are equal, and each unit's up and down norms agree."""
    arch = llama_arch(*config)
    a = random_params(arch)
    b = _scaled_units(arch, a, _log_uniform_scales(arch, seed=3))
    assert (logits(arch, b, ids) - logits(arch, a, ids)).abs().max() < 1e-10
    assert max_diff(b, a) > 0.5  # the scales are far from one
    ca, cb = canonical_params(arch, a), canonical_params(arch, b)
    assert max_diff(cb, ca) < 1e-12
    for l in range(arch.n_layer):
        m = f"blocks.{l}.mlp."
        up = ca[m + "fc1.weight"].pow(2).sum(1) + (ca[m + "fc1.bias"].pow(2) if m + "fc1.bias" in ca else 0.0)
        torch.testing.assert_close(up.sqrt(), ca[m + "fc2.weight"].norm(dim=0), rtol=1e-12, atol=0)
    assert max_diff(canonical_params(arch, ca), ca) < 1e-13  # idempotent up to rounding
    assert (logits(arch, ca, ids) - logits(arch, a, ids)).abs().max() < 1e-10


@pytest.mark.parametrize("method", ["weight", "activation"])
@pytest.mark.parametrize("config", CONFIGS[:3], ids=IDS[:3])
def test_matching_recovers_a_planted_symmetry_with_unit_scales(config, method):
    """B = g . A with g holding unit scales as well as every other group's element: the canonical
    forms take the scales, the matchers the rest, and the aligned B equals A (float64)."""
    arch = llama_arch(*config)
    spec = canonical_spec(arch)
    a = random_params(arch)
    pa = canonical_params(arch, a)
    scaled = canonical_params(arch, _scaled_units(arch, a, _log_uniform_scales(arch, seed=5)))
    planted = {n: E.random_element(group, torch.Generator().manual_seed(9)) for n, group in spec.groups.items()}
    pb = E.apply_spec(spec, scaled, planted)
    if method == "weight":
        found, _ = weight_matching(spec, pa, pb)
    else:
        gen = torch.Generator().manual_seed(7)
        found, _ = activation_matching(spec, pa, pb, [(torch.randint(0, VOCAB, (8, 16), generator=gen), None)
                                                      for _ in range(3)])
    _assert_recovered(spec, pa, pb, found, {n: E.inverse(g, planted[n]) for n, g in spec.groups.items()})


def test_unit_scales_are_outside_the_permutation_baseline():
    """The negative control: on raw parameters (Git Re-Basin's permutations, no canonical form) the
    same planted scales are not brought back, so the recovery above is the canonical form's doing."""
    arch = llama_arch(4, False, False)
    spec = permutation_spec(arch)
    a = random_params(arch)
    planted = {n: E.random_element(group, torch.Generator().manual_seed(9)) for n, group in spec.groups.items()}
    pb = E.apply_spec(spec, _scaled_units(arch, a, _log_uniform_scales(arch, seed=5)), planted)
    found, _ = weight_matching(spec, a, pb)
    assert max_diff(E.apply_spec(spec, pb, found), a) > 0.1


def test_a_unit_sign_flip_is_exact_but_not_in_the_group(ids):
    """s = -1 (up row and down column negated) is exact too: fc1 enters the gated product linearly.
    The canonical form fixes |s| only, so a flipped unit stays flipped (documented in ARCHITECTURE.md)."""
    arch = llama_arch(4, False, False)
    a = random_params(arch)
    signs = [torch.where(torch.arange(arch.d_mlp) % 3 == 0, -1.0, 1.0).double() for _ in range(arch.n_layer)]
    b = _scaled_units(arch, a, signs)
    assert (logits(arch, b, ids) - logits(arch, a, ids)).abs().max() < 1e-10
    assert max_diff(canonical_params(arch, b), canonical_params(arch, a)) > 0.1


@pytest.mark.parametrize("kind", ["llama", "hf_llama", "hf_qwen2"])
def test_align_brings_back_a_scaled_and_permuted_model_through_the_api(kind):
    """Through lf.align and Alignment.apply on the model classes: B = g . (A with unit scales) aligns
    back onto A with a zero barrier and A's canonical parameters."""
    import lmc_fast as lf
    from lmc_fast.models.adapters import adapter_for, standard_params
    from lmc_fast.symmetry import Alignment
    from zoo import make_inputs, make_model

    a = make_model(kind, seed=1)
    arch, raw = standard_params(a)
    scaled = adapter_for(a).build(a, _scaled_units(arch, raw, _log_uniform_scales(arch, seed=4)))
    b = Alignment.random(canonical_spec(arch), seed=2).apply(scaled)
    al = lf.align(a, b, "weight")
    want = canonical_params(arch, raw)
    assert max_diff(canonical_params(arch, standard_params(al.apply(b))[1]), want) < 1e-8
    data = [(make_inputs(kind, seed=s), None) for s in range(2)]
    data = [(x, x) for x, _ in data]
    assert lf.barrier(a, al.apply(b), data, lambdas=3).barrier < 1e-9


@pytest.mark.parametrize("config", CONFIGS[:3], ids=IDS[:3])
def test_residual_only_activation_matching_recovers_a_planted_symmetry(config):
    """The residual from the stream's activations alone, every other group by weight matching given
    it: a planted B = g . A comes back exactly, as with full activation statistics."""
    arch = llama_arch(*config)
    spec = canonical_spec(arch)
    pa, pb, want = _planted(arch, spec)
    gen = torch.Generator().manual_seed(7)
    data = [(torch.randint(0, VOCAB, (8, 16), generator=gen), None) for _ in range(3)]
    found, info = activation_matching(spec, pa, pb, data, residual_only=True)
    assert info["residual_only"]
    _assert_recovered(spec, pa, pb, found, want)
