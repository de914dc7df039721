"""Raw-space head permutations (the permutation baseline permutes whole heads, as in Verma &
Elbayad's Transformer re-basin) and learned matching over the permutation groups only."""
import pytest
import torch

import lmc_fast as lf
from lmc_fast.match.methods import method
from lmc_fast.match.kinds.heads import head_scores
from lmc_fast.match.solve import flat
from lmc_fast.models.adapters import standard_params
from lmc_fast.symmetry import Alignment, InvalidAlignmentError, permutation_spec
from lmc_fast.symmetry import elements as E
from zoo import KINDS, logits, make_inputs, make_model, rel_err, tolerance

HEAD_PARAMS = ("attn.q.weight", "attn.q.bias", "attn.k.weight", "attn.k.bias", "attn.v.weight", "attn.v.bias",
               "attn.o.weight")


def _planted(kind, seed, heads=True):
    a = make_model(kind, seed=seed)
    arch, _ = standard_params(a)
    truth = Alignment.random(permutation_spec(arch, heads=heads), seed=seed + 1)
    return a, truth.apply(a), truth


def test_spec_has_perm_only_head_groups_over_every_head_block():
    arch, _ = standard_params(make_model("gpt2"))
    spec = permutation_spec(arch)
    old = permutation_spec(arch, heads=False)
    assert set(spec.groups) - set(old.groups) == {f"heads.{l}" for l in range(arch.n_layer)}
    for l in range(arch.n_layer):
        g = spec.groups[f"heads.{l}"]
        assert g.kind == "heads" and g.head_map == "none" and g.n_heads == arch.n_head
        assert {ax.param for ax in g.axes} == {f"blocks.{l}.{p}" for p in HEAD_PARAMS}
        assert E.expected_shapes(g) == {"perm": (arch.n_head,)}
        assert set(E.identity(g)) == {"perm"}


@pytest.mark.parametrize("kind", KINDS)
def test_raw_head_permutation_alone_preserves_function_exactly(kind):
    """Whole heads (Q / K / V rows and biases, O columns) permuted with identity per-head maps:
    causal GPT-2, ViT and both HF variants compute the same function in float64."""
    m = make_model(kind, seed=41)
    arch, params = standard_params(m)
    spec = permutation_spec(arch)
    gen = torch.Generator().manual_seed(0)
    elements = {n: E.identity(g) for n, g in spec.groups.items()}
    for n, g in spec.groups.items():
        if g.kind == "heads":  # (grouped-query attention: key / value heads, and query heads within groups)
            G = g.kv_heads
            elements[n] = {**E.random_element(g, gen), "perm": torch.roll(torch.arange(G), 1)[torch.randperm(G, generator=gen)]}
    moved = Alignment(spec, elements).validate().apply(m)
    x = make_inputs(kind)
    assert rel_err(logits(moved, x), logits(m, x)) < tolerance(kind, 1e-12)
    _, new = standard_params(moved)
    for l in range(arch.n_layer):
        q = f"blocks.{l}.attn.q.weight"
        assert not torch.equal(new[q], params[q])  # the heads really moved


@pytest.mark.parametrize("kind", KINDS)
def test_permutation_matching_recovers_planted_heads_exactly(kind):
    a, b, truth = _planted(kind, seed=43)
    x = make_inputs(kind)
    assert rel_err(logits(b, x), logits(a, x)) < tolerance(kind, 1e-12)  # the plant preserves the function
    identity = {n: E.identity(g) for n, g in truth.spec.groups.items()}
    assert any(not torch.equal(truth[n][k], identity[n][k])  # some heads moved (grouped: or query heads within)
               for n in truth.spec.groups if n.startswith("heads.") for k in identity[n])
    al = lf.align(a, b, "permutation")
    assert al.info["heads"] is True and any(n.startswith("heads.") for n in al.spec.groups)
    inv = truth.inverse()
    for name in al.spec.groups:
        for key in ("perm", "qperm"):
            if key in inv[name]:
                assert torch.equal(al[name][key], inv[name][key]), (name, key)
    _, pa = standard_params(a)
    _, pal = standard_params(al.apply(b))
    assert all(torch.equal(pal[k], pa[k]) for k in pa)  # the identity alignment back


def test_heads_false_is_the_old_baseline():
    a, b, _ = _planted("vit", seed=44)
    al = lf.align(a, b, "permutation", heads=False)
    assert al.info["heads"] is False
    assert not any(g.kind == "heads" for g in al.spec.groups.values())
    _, pa = standard_params(a)
    _, pal = standard_params(al.apply(b))
    assert max((pal[k] - pa[k]).abs().max().item() for k in pa) > 1e-3  # planted heads stay unmatched
    with pytest.raises(ValueError, match="heads is an option of method 'permutation'"):
        lf.align(a, b, "weight", heads=False)
    assert "heads" in method("permutation").options


def test_head_scores_are_blockwise_inner_products():
    a, b = make_model("hf_gpt2", seed=45), make_model("hf_gpt2", seed=46)
    arch, pa = standard_params(a)
    _, pb = standard_params(b)
    g = permutation_spec(arch).groups["heads.1"]
    S = head_scores(g, pa, pb)
    dh = arch.d_head
    for i, j in [(0, 0), (1, 3), (3, 2)]:
        want = sum((flat(pa[ax.param], ax.axis)[i * dh:(i + 1) * dh]
                    * flat(pb[ax.param], ax.axis)[j * dh:(j + 1) * dh]).sum() for ax in g.axes)
        assert torch.allclose(S[i, j], want, rtol=1e-12)


def test_head_permutation_elements_validate_and_round_trip(tmp_path):
    m = make_model("gpt2", seed=47)
    arch, _ = standard_params(m)
    spec = permutation_spec(arch)
    al = Alignment.random(spec, seed=3).validate()
    g = spec.groups["heads.0"]
    bad = dict(al.elements)
    bad["heads.0"] = {"perm": torch.zeros(g.n_heads, dtype=torch.long)}
    with pytest.raises(InvalidAlignmentError, match="not a bijection"):
        Alignment(spec, bad).validate()
    bad["heads.0"] = {**E.identity(g), "qk": torch.eye(g.head_dim).expand(g.n_heads, -1, -1)}
    with pytest.raises(InvalidAlignmentError, match="unexpected entries"):
        Alignment(spec, bad).validate()
    # compose / inverse, and files with and without head groups load back
    ident = al.compose(al.inverse())
    assert all(torch.equal(ident[n]["perm"], E.identity(g)["perm"]) for n, g in spec.groups.items())
    for heads in (True, False):
        one = Alignment.random(permutation_spec(arch, heads=heads), seed=4)
        path = tmp_path / f"al{heads}.safetensors"
        one.save(path)
        back = Alignment.load(path)
        assert set(back.spec.groups) == set(one.spec.groups)
        assert all(torch.equal(back[n]["perm"], one[n]["perm"]) for n in one.spec.groups)


def _vit_pair_and_data():
    a, b = make_model("vit", seed=48, dtype=torch.float32), make_model("vit", seed=49, dtype=torch.float32)
    data = [(make_inputs("vit", seed=s, batch=8, dtype=torch.float32),
             torch.randint(0, 5, (8,), generator=torch.Generator().manual_seed(s))) for s in range(4)]
    return a, b, data


def test_learn_permutations_trains_only_the_permutation_latents():
    a, b, data = _vit_pair_and_data()
    la = lf.LearnedAlignment(a, b, learn="permutations")
    trains = {n for n, p in la.named_parameters() if p.requires_grad}
    assert trains == {"latents.0.blocks.mlp.perm", "latents.0.blocks.heads.perm"}
    before = {n: p.detach().clone() for n, p in la.named_parameters()}
    start = la.alignment()
    opt = torch.optim.Adam(la.parameters(), lr=0.5)
    for x, y in data * 2:
        loss = torch.nn.functional.cross_entropy(la(x, lam=0.5), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    after = dict(la.named_parameters())
    for n in ("latents.0.blocks.residual.rotation", "latents.0.blocks.heads.maps"):
        assert torch.equal(after[n], before[n]), n
    assert not torch.equal(after["latents.0.blocks.mlp.perm"], before["latents.0.blocks.mlp.perm"])
    end = la.alignment()
    for name, group in la.spec.groups.items():
        keys = ("matrix",) if group.kind == "orthogonal" else ("qk", "vo") if group.kind == "heads" else ()
        for key in keys:  # the continuous elements stay at the init, bitwise
            assert torch.equal(end[name][key], start[name][key]), (name, key)


def test_align_learned_permutations_runs():
    a, b, data = _vit_pair_and_data()
    init = lf.align(a, b, "weight")
    al = lf.align(a, b, "learned", data=data, learn="permutations", steps=3, eval_every=1, init=init)
    assert al.info["learn"] == "permutations"
    start = lf.LearnedAlignment(a, b, init, learn="permutations").alignment()
    for name, group in al.spec.groups.items():
        if group.kind == "orthogonal":
            assert torch.equal(al[name]["matrix"], start[name]["matrix"]), name
        elif group.kind == "heads":
            assert torch.equal(al[name]["qk"], start[name]["qk"]) and torch.equal(al[name]["vo"], start[name]["vo"])
    al.validate()
