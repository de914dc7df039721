"""Every symmetry group preserves the function; Alignment inverse / compose / save / load."""
import pytest
import torch

from lmc_fast.models.adapters import standard_params
from lmc_fast.symmetry import Alignment, canonical_spec, permutation_spec, random_element
from zoo import KINDS, logits, make_inputs, make_model, rel_err, tolerance


def spec_of(model, which):
    arch, _ = standard_params(model)
    if which == "permutation":
        return permutation_spec(arch)
    return canonical_spec(arch, head_map=which)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("which", ["orthogonal", "invertible", "permutation"])
def test_random_group_elements_preserve_function(kind, which):
    m = make_model(kind, seed=11)
    x = make_inputs(kind)
    spec = spec_of(m, which)
    for seed in range(2):
        b = Alignment.random(spec, seed=seed).apply(m)
        assert type(b) is type(m)
        assert rel_err(logits(b, x), logits(m, x)) < tolerance(kind, 1e-9)
        # and it really moved the parameters
        assert any((p1 - p2).abs().max() > 1e-3 for p1, p2 in zip(b.parameters(), m.parameters())
                   if p1.shape == p2.shape)


@pytest.mark.parametrize("kind", ["vit", "gpt2"])
def test_each_group_alone_preserves_function(kind):
    m = make_model(kind, seed=12)
    x = make_inputs(kind)
    spec = spec_of(m, "invertible")
    gen = torch.Generator().manual_seed(0)
    ref = logits(m, x)
    for name, group in spec.groups.items():
        elements = Alignment.identity(spec).elements
        elements[name] = random_element(group, gen)
        assert rel_err(logits(Alignment(spec, elements).apply(m), x), ref) < 1e-9, name


def test_rmsnorm_residual_is_full_orthogonal_group():
    m = make_model("gpt2", seed=13, norm="rmsnorm")
    spec = spec_of(m, "orthogonal")
    assert not spec.groups["residual"].centred
    x = make_inputs("gpt2")
    assert rel_err(logits(Alignment.random(spec, 3).apply(m), x), logits(m, x)) < 1e-9


def test_random_residual_fixes_ones_for_layernorm():
    spec = spec_of(make_model("vit"), "orthogonal")
    R = Alignment.random(spec, seed=1)["residual"]["matrix"]
    d = R.shape[0]
    assert torch.allclose(R @ R.T, torch.eye(d, dtype=R.dtype), atol=1e-12)
    assert torch.allclose(R @ torch.ones(d, dtype=R.dtype), torch.ones(d, dtype=R.dtype), atol=1e-12)
    assert (R - torch.eye(d, dtype=R.dtype)).abs().max() > 0.1


def test_invertible_head_maps_are_well_conditioned_but_not_orthogonal():
    spec = spec_of(make_model("vit"), "invertible")
    el = Alignment.random(spec, seed=2)["heads.0"]
    cond = torch.linalg.cond(el["qk"])
    assert (cond < 10).all() and (cond > 1.05).any()


@pytest.mark.parametrize("which", ["orthogonal", "invertible", "permutation"])
def test_compose_inverse_is_identity(which):
    m = make_model("gpt2", seed=14)
    spec = spec_of(m, which)
    a = Alignment.random(spec, seed=5)
    ident = a.compose(a.inverse())
    for name, el in ident.elements.items():
        ref = Alignment.identity(spec)[name]
        for key, t in el.items():
            assert torch.allclose(t.to(ref[key].dtype), ref[key], atol=1e-10), (name, key)


def test_compose_matches_sequential_application():
    m = make_model("vit", seed=15)
    spec = spec_of(m, "invertible")
    a, b = Alignment.random(spec, seed=1), Alignment.random(spec, seed=2)
    one = a.compose(b).apply(m)
    two = a.apply(b.apply(m))
    for (n, p1), p2 in zip(one.named_parameters(), two.parameters()):
        assert torch.allclose(p1, p2, atol=1e-10), n


@pytest.mark.parametrize("which", ["orthogonal", "invertible", "permutation"])
def test_save_load_round_trip_exactly(tmp_path, which):
    m = make_model("hf_gpt2", seed=16)
    a = Alignment.random(spec_of(m, which), seed=4)
    a.info["objective"] = [1.0, 2.5]
    path = tmp_path / "al.safetensors"
    a.save(path)
    b = Alignment.load(path)
    assert b.spec.space == a.spec.space and b.spec.arch == a.spec.arch
    assert b.info["objective"] == [1.0, 2.5]
    for name, el in a.elements.items():
        for key, t in el.items():
            assert torch.equal(t, b[name][key])
    for p1, p2 in zip(b.apply(m).parameters(), a.apply(m).parameters()):
        assert torch.allclose(p1, p2, rtol=0, atol=1e-14)


def test_corrupt_alignment_file(tmp_path):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all, truncated")
    with pytest.raises(ValueError, match="not a valid lmc_fast alignment file"):
        Alignment.load(path)
    with pytest.raises(FileNotFoundError):
        Alignment.load(tmp_path / "missing.safetensors")


def test_save_is_atomic(tmp_path, monkeypatch):
    a = Alignment.random(spec_of(make_model("vit"), "orthogonal"))
    path = tmp_path / "al.safetensors"
    import safetensors.torch

    def boom(*args, **kw):
        raise OSError("disk full")

    monkeypatch.setattr(safetensors.torch, "save_file", boom)
    with pytest.raises(OSError):
        a.save(path)
    assert list(tmp_path.iterdir()) == []


def test_apply_to_mismatched_model_names_the_problem():
    a = Alignment.random(spec_of(make_model("vit", d_mlp=48), "orthogonal"))
    with pytest.raises(ValueError, match="n_layer is 3, expected 2"):
        a.apply(make_model("vit", d_mlp=48, n_layer=3))
    with pytest.raises(ValueError, match="n_layer is 3, expected 2"):  # narrower, but differs elsewhere too
        a.apply(make_model("vit", d_mlp=40, n_layer=3))
    with pytest.raises(ValueError, match="wider MLP"):
        a.apply(make_model("vit", d_mlp=56))
    with pytest.raises(ValueError, match="family"):
        a.apply(make_model("gpt2", d_mlp=48))
    narrow = make_model("vit", d_mlp=40)  # narrower MLP only: zero-padded, then aligned
    x = make_inputs("vit")
    assert rel_err(logits(a.apply(narrow), x), logits(narrow, x)) < 1e-9


def test_alignment_distance_counts_reassigned_units_and_relative_map_change():
    import math

    from lmc_fast.symmetry import Alignment, canonical_spec
    from lmc_fast.models.adapters import standard_params
    from zoo import make_model

    spec = canonical_spec(standard_params(make_model("vit"))[0])
    start = Alignment.identity(spec)
    assert all(v == 0.0 for d in start.distance(start).values() for v in d.values())
    moved = Alignment.random(spec, seed=1)
    d = moved.distance(start)
    for name, group in spec.groups.items():
        el = moved.elements[name]
        if "perm" in el:
            want = float((el["perm"] != torch.arange(len(el["perm"]))).double().mean())
            assert d[name]["perm"] == want
        for key in ("matrix", "qk", "vo"):
            if key in el:
                eye = start.elements[name][key]
                assert math.isclose(d[name][key], float((el[key] - eye).norm() / eye.norm()), rel_tol=1e-12)
    swapped = Alignment(spec, {n: dict(e) for n, e in start.elements.items()})
    perm = torch.arange(spec.groups["mlp.0"].size)
    perm[[0, 1]] = perm[[1, 0]]
    swapped.elements["mlp.0"] = {"perm": perm}
    assert swapped.distance(start)["mlp.0"]["perm"] == 2 / len(perm)
