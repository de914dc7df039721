"""bench/rotary_gap.py on planted cases: the SwiGLU sign post-pass finds planted signs and recovers the
model exactly without changing its function; a part's cost is non-zero only for the part that differs."""
import copy
import sys
from pathlib import Path

import pytest
import torch

from lmc_fast.models.llama import Llama, LlamaConfig
from lmc_fast.sweep.interpolate import space_params

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import rotary_gap  # noqa: E402

VOCAB, T = 64, 16


def tiny_llama(seed: int) -> Llama:
    torch.manual_seed(seed)
    return Llama(LlamaConfig(n_layer=2, d_model=32, n_head=4, n_kv_head=2, d_mlp=48, vocab_size=VOCAB,
                             block_size=T)).eval()


def tokens(seed: int, n: int = 2):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, VOCAB, (n * 8, T + 1), generator=g)
    return [(x[i:i + 8, :-1], x[i:i + 8, 1:]) for i in range(0, n * 8, 8)]


def planted_signs(model: Llama, seed: int):
    """`model` with each MLP's units permuted and a third of them negated (up row and down column together)."""
    b, g, flipped = copy.deepcopy(model), torch.Generator().manual_seed(seed), 0
    with torch.no_grad():
        for block in b.blocks:
            mlp = block.mlp
            n = mlp.fc1.weight.shape[0]
            perm = torch.randperm(n, generator=g)
            sign = torch.ones(n)
            sign[torch.randperm(n, generator=g)[: n // 3]] = -1
            mlp.gate.weight.copy_(mlp.gate.weight[perm])
            mlp.fc1.weight.copy_(mlp.fc1.weight[perm] * sign[:, None])
            mlp.fc2.weight.copy_(mlp.fc2.weight[:, perm] * sign[None])
            flipped += n // 3
    return b, flipped


def test_the_sign_pass_finds_planted_signs_and_recovers_the_model():
    a = tiny_llama(0)
    b, planted = planted_signs(a, seed=1)
    x = tokens(2)[0][0]
    with torch.no_grad():
        assert torch.allclose(a(x), b(x), atol=1e-5)  # the planted signs are a symmetry
    recovered, flipped = rotary_gap.signed_units(a, b)
    assert flipped[0] == planted and flipped[1:] == [0] * (rotary_gap.SIGN_ROUNDS - 1)
    _, pa = space_params(a, "canonical")
    _, pr = space_params(recovered, "canonical")
    assert max(float((pa[k] - pr[k]).abs().max()) for k in pa) < 1e-5
    with torch.no_grad():
        assert torch.allclose(recovered(x), b(x), atol=1e-5)


@pytest.mark.parametrize("name, part", [("lm_head.weight", "head"), ("blocks.1.attn.v.weight", "attn1.vo"),
                                        ("blocks.0.attn.k.weight", "attn0.qk"), ("blocks.1.mlp.gate.weight", "mlp1"),
                                        ("tok_embed.weight", "embed")])
def test_only_the_part_that_differs_costs_anything(name, part):
    a = tiny_llama(0)
    b = copy.deepcopy(a)
    with torch.no_grad():
        b.get_parameter(name).add_(5.0 * torch.randn_like(b.get_parameter(name)))
    assert rotary_gap.part_of(name) == part
    costs = rotary_gap.part_costs(a, b, tokens(3))
    assert set(costs) == {"embed", "head", "attn0.qk", "attn0.vo", "attn1.qk", "attn1.vo", "mlp0", "mlp1"}
    assert abs(costs[part]) > 1e-4  # a random model barely reacts, but far above the others
    assert all(abs(c) < 1e-6 for p, c in costs.items() if p != part), costs


ARCH_VARIANTS = [n for n, (_, _, arch_overrides) in rotary_gap.VARIANTS.items() if arch_overrides]


def lm_tokens(seed: int, n: int = 4, t: int = 32):
    return torch.randint(0, 256, (n, t), generator=torch.Generator().manual_seed(seed))


def test_the_study_has_the_five_norm_and_mlp_variants():
    assert ARCH_VARIANTS == ["llama-layernorm", "llama-gelu", "llama-gelu-narrow", "neox-swiglu", "neox-rmsnorm"]


@pytest.mark.parametrize("name", ARCH_VARIANTS)
def test_an_arch_variant_reads_every_parameter_it_has_and_is_the_architecture_it_names(name):
    model = rotary_gap.variant_model(name, seed=0)
    arch = model.arch()
    for field, value in rotary_gap.VARIANTS[name][2].items():
        assert getattr(arch, field) == value
    names = set(dict(model.named_parameters()))
    assert ("blocks.0.mlp.gate.weight" in names) == arch.gated
    assert ("blocks.0.ln1.bias" in names) == (arch.norm == "layernorm")
    assert ("blocks.0.mlp.fc1.bias" in names) == bool(arch.mlp_bias)
    assert model.blocks[0].mlp.fc1.weight.shape[0] == arch.d_mlp == model.config.d_mlp
    # the functional forward of that Arch reads each of them (a parameter it ignored would get no gradient)
    model(lm_tokens(1)).square().mean().backward()
    unread = [k for k, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert unread == []


@pytest.mark.parametrize("name", ARCH_VARIANTS)
def test_an_arch_variant_survives_saving_and_its_group_is_exact(name, tmp_path):
    from lmc_fast.symmetry import Alignment, canonical_spec

    a = rotary_gap.variant_model(name, seed=0).eval()
    with torch.no_grad():  # break the init's symmetries between norms (ones) so a wrong fold would show
        for p in a.parameters():
            if p.dim() == 1:
                p.add_(0.3 * torch.randn_like(p))
    rotary_gap.save_variant(a, tmp_path / name / "seed0", {"seed": 0})
    loaded = rotary_gap.load_variant(tmp_path, name, 0)
    assert type(loaded) is type(a)
    x = lm_tokens(2)
    with torch.no_grad():
        assert torch.equal(loaded(x), a(x))
    b = Alignment.random(canonical_spec(a.arch()), seed=3).apply(a)
    with torch.no_grad():
        assert torch.allclose(b(x), a(x), atol=2e-4)  # a planted element keeps the function
        _, pa = space_params(a, "canonical")
        _, pb = space_params(b, "canonical")
        assert max(float((pa[k] - pb[k]).abs().max()) for k in pa) > 0.1  # and really moved B
        aligned = rotary_gap.lf.align(a, b, "weight").apply(b)
        _, pr = space_params(aligned, "canonical")
        assert max(float((pa[k] - pr[k]).abs().max()) for k in pa) < 1e-4  # recovered
