"""Hostile inputs: corrupt alignment elements and files, alignments applied to the wrong models,
and models that differ in one architecture field. Each must fail with one clear ValueError
naming the group / field and the measured or differing values; valid alignments still work."""
import json
import math
import warnings

import pytest
import torch
from safetensors.torch import save_file

import lmc_fast as lf
from lmc_fast.models import GPT2, GPT2Config, ViT, ViTConfig
from lmc_fast.models.adapters import IncompatibleModelsError, check_compatible, standard_params
from lmc_fast.symmetry import (Alignment, AlignmentMismatchError, InvalidAlignmentError, canonical_spec,
                               model_fingerprint, permutation_spec)
from lmc_fast.symmetry import elements as E
from lmc_fast.symmetry.elements import random_orthogonal


def tiny_vit(seed=0, **overrides):
    torch.manual_seed(seed)
    cfg = ViTConfig.digits(**{"d_model": 16, "n_layer": 1, "n_head": 2, "d_mlp": 32, **overrides})
    return ViT(cfg).double().eval()


def tiny_gpt2(seed=0, **overrides):
    torch.manual_seed(seed)
    cfg = GPT2Config(**{"n_layer": 1, "n_embd": 16, "n_head": 2, "vocab_size": 64, "block_size": 16, **overrides})
    return GPT2(cfg).double().eval()


def hf_gpt2(seed=0, **overrides):
    import transformers

    torch.manual_seed(seed)
    kw = {"n_layer": 1, "n_embd": 16, "n_head": 2, "vocab_size": 64, "n_positions": 16, "n_inner": 32,
          "bos_token_id": 0, "eos_token_id": 0, **overrides}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return transformers.GPT2LMHeadModel(transformers.GPT2Config(**kw)).eval()


def hf_vit(seed=0, **overrides):
    import transformers

    torch.manual_seed(seed)
    kw = {"image_size": 8, "patch_size": 2, "num_channels": 1, "hidden_size": 16, "num_hidden_layers": 1,
          "num_attention_heads": 2, "intermediate_size": 32, "num_labels": 10, **overrides}
    return transformers.ViTForImageClassification(transformers.ViTConfig(**kw)).eval()


def images(n=4):
    return torch.randn(n, 1, 8, 8, generator=torch.Generator().manual_seed(7), dtype=torch.float64)


# ------------------------------------------------------------------ corrupt elements
def _orth_spec():
    return canonical_spec(standard_params(tiny_vit())[0], "orthogonal")


def _inv_spec():
    return canonical_spec(standard_params(tiny_vit())[0], "invertible")


def _singular(M):
    M = M.clone()
    M[0, 0] = M[0, 1] = 0.0  # head 0's map: rank-deficient below
    M[0, :, 0] = M[0, :, 1]
    return M


def _ill_conditioned(M):
    U, S, Vh = torch.linalg.svd(M)
    S = S.clone()
    S[..., -1] = S[..., 0] * 1e-10
    return U @ torch.diag_embed(S) @ Vh


def _not_keeping_ones(M):
    return random_orthogonal(M.shape[0], torch.Generator().manual_seed(3))


def _noisy_fp32(M):
    return (M + 1e-3 * torch.randn(M.shape, generator=torch.Generator().manual_seed(4), dtype=M.dtype)).float()


def _set(t, i, v):
    t = t.clone()
    t[i] = v
    return t


# (case id, spec maker, group, key, corruption, text the message must hold)
ELEMENT_CASES = [
    ("duplicate_perm", _orth_spec, "mlp.0", "perm", lambda p: _set(p, 1, p[0]), "not a bijection"),
    ("out_of_range_perm", _orth_spec, "mlp.0", "perm", lambda p: _set(p, 0, len(p)), "out of range"),
    ("negative_perm", _orth_spec, "mlp.0", "perm", lambda p: _set(p, 0, -1), "negative index -1"),
    ("float_perm", _orth_spec, "mlp.0", "perm", lambda p: p.double(), "must hold integers"),
    ("short_perm", _orth_spec, "mlp.0", "perm", lambda p: p[:-1], "has shape (31,), expected (32,)"),
    ("duplicate_head_perm", _orth_spec, "heads.0", "perm", lambda p: _set(p, 1, p[0]), "not a bijection"),
    ("zero_matrix", _orth_spec, "residual", "matrix", torch.zeros_like, "not orthogonal: max|Q^T Q - I| = 1"),
    ("random_matrix", _orth_spec, "residual", "matrix",
     lambda M: torch.randn(M.shape, generator=torch.Generator().manual_seed(1), dtype=M.dtype), "not orthogonal"),
    ("x1000_orthogonal", _orth_spec, "residual", "matrix", lambda M: 1000 * M, "not orthogonal: max|Q^T Q - I| = 1e+06"),
    ("nan_matrix", _orth_spec, "residual", "matrix", lambda M: _set(M, (0, 0), math.nan), "NaN or inf"),
    ("inf_head_map", _orth_spec, "heads.0", "qk", lambda M: _set(M, (0, 0, 0), math.inf), "NaN or inf"),
    ("not_keeping_ones", _orth_spec, "residual", "matrix", _not_keeping_ones, "all-ones"),
    ("noisy_fp32_orthogonal", _orth_spec, "residual", "matrix", _noisy_fp32, "not orthogonal"),
    ("head_map_not_orthogonal", _orth_spec, "heads.0", "vo", lambda M: _set(M, 1, 2 * M[1]),
     "'vo' is not orthogonal (head 1): max|Q^T Q - I| = 3"),
    ("singular_invertible", _inv_spec, "heads.0", "vo", _singular, "singular or ill-conditioned (head 0)"),
    ("ill_conditioned_invertible", _inv_spec, "heads.0", "qk", _ill_conditioned, "condition number 1e+10"),
    ("wrong_shape_matrix", _orth_spec, "residual", "matrix", lambda M: M[:-1, :-1], "has shape (15, 15)"),
    ("int_matrix", _orth_spec, "residual", "matrix", lambda M: M.long(), "must be float32 or float64"),
    ("raw_duplicate_residual", lambda: permutation_spec(standard_params(tiny_vit())[0]), "residual", "perm",
     lambda p: _set(p, 2, p[3]), "not a bijection"),
]


def _corrupted(make_spec, group, key, corrupt):
    al = Alignment.random(make_spec(), seed=0)
    elements = {n: dict(el) for n, el in al.elements.items()}
    elements[group][key] = corrupt(elements[group][key])
    return Alignment(al.spec, elements)


@pytest.mark.parametrize("case", ELEMENT_CASES, ids=[c[0] for c in ELEMENT_CASES])
def test_corrupt_element_is_refused_on_load(tmp_path, case):
    _, make_spec, group, key, corrupt, text = case
    path = tmp_path / "al.safetensors"
    _corrupted(make_spec, group, key, corrupt)._write(path)  # a file damaged after it was written
    with pytest.raises(InvalidAlignmentError) as err:
        Alignment.load(path)
    msg = str(err.value)
    assert f"group {group!r}" in msg and text in msg and "\n" not in msg, msg


@pytest.mark.parametrize("case", ELEMENT_CASES, ids=[c[0] for c in ELEMENT_CASES])
def test_corrupt_element_is_refused_on_apply(case):
    _, make_spec, group, key, corrupt, text = case
    with pytest.raises(InvalidAlignmentError, match=f"group '{group}'") as err:
        _corrupted(make_spec, group, key, corrupt).apply(tiny_vit())
    assert text in str(err.value)


# ------------------------------------------------------------------ corrupt files
def _valid_file(tmp_path):
    path = tmp_path / "al.safetensors"
    Alignment.random(_orth_spec(), seed=0).save(path)
    return path


def _rewrite(path, edit_header=None, edit_tensors=None):
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        header, tensors = json.loads(f.metadata()["lmc_fast"]), {k: f.get_tensor(k) for k in f.keys()}
    if edit_header:
        edit_header(header)
    if edit_tensors:
        edit_tensors(tensors)
    save_file(tensors, str(path), metadata={"lmc_fast": json.dumps(header)})


def _arch(**kw):
    return lambda h: h["arch"].update(kw)


def _deep_header(path):
    save_file({"x": torch.zeros(1)}, str(path), metadata={"lmc_fast": "[" * 100_000 + "]" * 100_000})


def _truncated(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


FILE_CASES = [
    ("deep_json_header", _deep_header, "nested too deeply"),
    ("not_safetensors", lambda p: p.write_text("name,loss\na,1.0\n" * 50), "not a valid lmc_fast alignment file"),
    ("truncated", _truncated, "not a valid lmc_fast alignment file"),
    ("empty", lambda p: p.write_bytes(b""), "not a valid lmc_fast alignment file"),
    ("plain_checkpoint", lambda p: save_file({"w": torch.zeros(2)}, str(p)), "no lmc_fast header"),
    ("arch_negative_n_layer", lambda p: _rewrite(p, _arch(n_layer=-1)), "arch n_layer is -1"),
    ("arch_negative_d_model", lambda p: _rewrite(p, _arch(d_model=-16)), "arch d_model is -16"),
    ("arch_huge_n_layer", lambda p: _rewrite(p, _arch(n_layer=1_000_000)), "n_layer is 1000000"),
    ("arch_nan_eps", lambda p: _rewrite(p, _arch(eps=math.nan)), "arch eps is nan"),
    ("arch_family", lambda p: _rewrite(p, _arch(family="resnet")), "arch family is 'resnet'"),
    ("arch_bool_size", lambda p: _rewrite(p, _arch(n_head=True)), "arch n_head is True"),
    ("arch_unknown_field", lambda p: _rewrite(p, _arch(dropout=0.1)), "arch has unknown fields ['dropout']"),
    ("unknown_header_key", lambda p: _rewrite(p, lambda h: h.update(evil=1)), "unknown header keys ['evil']"),
    ("info_not_object", lambda p: _rewrite(p, lambda h: h.update(info=[1, 2])), "info must be an object"),
    ("bad_space", lambda p: _rewrite(p, lambda h: h.update(space="latent")), "space must be"),
    ("unexpected_tensor", lambda p: _rewrite(p, edit_tensors=lambda t: t.update({"mlp.0/extra": torch.zeros(1)})),
     "unexpected tensors ['mlp.0/extra']"),
    ("missing_tensor", lambda p: _rewrite(p, edit_tensors=lambda t: t.pop("heads.0/qk")), "missing tensors"),
]


@pytest.mark.parametrize("case", FILE_CASES, ids=[c[0] for c in FILE_CASES])
def test_corrupt_file_is_refused_in_one_line(tmp_path, case):
    _, corrupt, text = case
    path = _valid_file(tmp_path)
    corrupt(path)
    with pytest.raises(InvalidAlignmentError) as err:
        Alignment.load(path)
    msg = str(err.value)
    assert text in msg and "\n" not in msg and len(msg) < 500, msg


# ------------------------------------------------------------------ fingerprints
@pytest.fixture(scope="module")
def aligned_pair():
    a, b = tiny_vit(0), tiny_vit(1)
    return a, b, lf.align(a, b, "weight", max_iter=3)


def test_fingerprints_are_recorded_and_survive_save_load(tmp_path, aligned_pair):
    a, b, al = aligned_pair
    assert al.info["fingerprint_a"] == model_fingerprint(a) != al.info["fingerprint_b"] == model_fingerprint(b)
    path = tmp_path / "al.safetensors"
    al.save(path)
    assert Alignment.load(path).verify_models(a, b) is True
    assert model_fingerprint(a.float()) == model_fingerprint(a)  # precision of the copy does not matter


def test_verify_models_refuses_another_model_unless_forced(aligned_pair):
    a, b, al = aligned_pair
    other = tiny_vit(2)
    with pytest.raises(AlignmentMismatchError) as err:
        al.verify_models(a, other)
    msg = str(err.value)
    fa, fb = al.info["fingerprint_a"], al.info["fingerprint_b"]
    assert msg == (f"alignment was made for models {fa[:12]}/{fb[:12]}, got {fa[:12]}/{model_fingerprint(other)[:12]}: "
                   "pass --force to apply it anyway")
    with pytest.raises(AlignmentMismatchError):
        al.verify_models(b, a)  # swapped roles
    assert al.verify_models(a, other, force=True) is False
    assert al.inverse().verify_models(b, a) is True
    assert Alignment(al.spec, al.elements).verify_models(a, other) is False  # no fingerprint: old file passes
    al.apply(other)  # plain apply does not check fingerprints (internal code applies to transformed models)


# ------------------------------------------------------------------ architecture fields
VIT_FIELDS = [("image_size", 16), ("patch_size", 4), ("channels", 3), ("num_classes", 5), ("d_model", 32),
              ("n_layer", 2), ("n_head", 4), ("d_mlp", 64), ("norm", "rmsnorm"), ("eps", 1e-6),
              ("activation", "gelu_tanh")]
GPT2_FIELDS = [("n_layer", 2), ("n_embd", 32), ("n_head", 4), ("vocab_size", 32), ("block_size", 32),
               ("d_mlp", 128), ("norm", "rmsnorm"), ("eps", 1e-6), ("activation", "gelu")]


def _assert_names(err, field, got, want, what="model_b", ref="model_a"):
    msg = str(err.value)
    assert f"{field} is {got!r}" in msg and f"{ref} has {want!r}" in msg and what in msg, msg


@pytest.mark.parametrize("field,value", VIT_FIELDS, ids=[f for f, _ in VIT_FIELDS])
def test_vit_field_mismatch_is_named(field, value):
    a, b = tiny_vit(0), tiny_vit(1, **{field: value})
    with pytest.raises(IncompatibleModelsError) as err:
        lf.align(a, b, "weight", max_iter=1)
    _assert_names(err, field, value, getattr(a.config, field))


@pytest.mark.parametrize("field,value", GPT2_FIELDS, ids=[f for f, _ in GPT2_FIELDS])
def test_gpt2_field_mismatch_is_named(field, value):
    a, b = tiny_gpt2(0), tiny_gpt2(1, **{field: value})
    with pytest.raises(IncompatibleModelsError) as err:
        check_compatible(a, b)
    _assert_names(err, field, value, getattr(a.config, field))


HF_FIELDS = [(hf_gpt2, "n_positions", 32), (hf_gpt2, "vocab_size", 48), (hf_gpt2, "layer_norm_epsilon", 1e-6),
             (hf_gpt2, "activation_function", "gelu"), (hf_vit, "patch_size", 4), (hf_vit, "image_size", 16),
             (hf_vit, "num_channels", 3), (hf_vit, "num_labels", 5), (hf_vit, "hidden_act", "gelu_new"),
             (hf_vit, "layer_norm_eps", 1e-6)]


@pytest.mark.parametrize("make,field,value", HF_FIELDS, ids=[f"{m.__name__}-{f}" for m, f, _ in HF_FIELDS])
def test_hf_field_mismatch_is_named(make, field, value):
    a, b = make(0), make(1, **{field: value})
    with pytest.raises(IncompatibleModelsError) as err:
        check_compatible(a, b)
    _assert_names(err, field, value, getattr(a.config, field))


def test_field_mismatch_is_named_through_align_merge_and_apply():
    a = hf_gpt2(0)
    with pytest.raises(IncompatibleModelsError) as err:
        lf.align(a, hf_gpt2(1, n_positions=32))
    _assert_names(err, "n_positions", 32, 16)
    with pytest.raises(IncompatibleModelsError) as err:  # across classes: class-independent names
        check_compatible(tiny_gpt2(0, d_mlp=32), hf_gpt2(1, n_positions=32))
    _assert_names(err, "context", 32, 16)
    with pytest.raises(IncompatibleModelsError) as err:
        lf.merge_many([tiny_gpt2(0), tiny_gpt2(1), tiny_gpt2(2, vocab_size=32)])
    _assert_names(err, "vocab_size", 32, 64, "models[2]", "models[0]")
    al = Alignment.random(canonical_spec(standard_params(tiny_vit())[0]))
    with pytest.raises(ValueError, match=r"eps is 1e-06, expected 1e-05"):
        al.apply(tiny_vit(eps=1e-6))
    with pytest.raises(ValueError, match=r"activation is 'gelu_tanh', expected 'gelu'"):
        al.apply(tiny_vit(activation="gelu_tanh"))


def test_allowed_differences_still_align():
    check_compatible(tiny_vit(0), tiny_vit(1, d_mlp=24))  # narrower MLP: zero-padded
    a, b = tiny_gpt2(0), tiny_gpt2(1, tie_word_embeddings=False)
    al = lf.align(a, b, "weight", max_iter=2)
    assert al.verify_models(a, b) is True


# ------------------------------------------------------------------ valid alignments still work
@pytest.mark.parametrize("which", ["orthogonal", "invertible", "permutation"])
def test_valid_alignment_round_trips_and_preserves_function(tmp_path, which):
    m = tiny_vit(5)
    arch = standard_params(m)[0]
    spec = permutation_spec(arch) if which == "permutation" else canonical_spec(arch, which)
    path = tmp_path / "al.safetensors"
    Alignment.random(spec, seed=1).save(path)
    moved = Alignment.load(path).apply(m)
    x = images()
    assert (moved(x) - m(x)).abs().max() < 1e-10
    assert any((p - q).abs().max() > 1e-3 for p, q in zip(moved.parameters(), m.parameters()))


def test_float32_elements_pass_and_snap_restores_float64_precision():
    al = Alignment.random(_orth_spec(), seed=2)
    f32 = Alignment(al.spec, {n: {k: (v.float() if v.is_floating_point() else v) for k, v in el.items()}
                              for n, el in al.elements.items()})
    f32.validate()
    with pytest.raises(InvalidAlignmentError):  # float32 accuracy stored as float64 is not orthogonal to 1e-10
        Alignment(al.spec, {n: {k: v.double() if v.is_floating_point() else v for k, v in el.items()}
                            for n, el in f32.elements.items()}).validate()
    snapped = Alignment(al.spec, {n: E.snap(g, f32.elements[n]) for n, g in al.spec.groups.items()})
    snapped.validate()
    assert (snapped["residual"]["matrix"] - al["residual"]["matrix"]).abs().max() < 1e-5


@pytest.mark.parametrize("entry", ["barrier", "interpolate", "simplex"])
def test_sweeps_compare_every_config_field(entry):
    """eps differs: the sweep would score B with A's eps; it must refuse and name the field."""
    import lmc_fast as lf
    from lmc_fast.models import ViT, ViTConfig

    cfg = dict(d_model=16, n_layer=1, n_head=2, d_mlp=32)
    a, b = ViT(ViTConfig.digits(**cfg)).eval(), ViT(ViTConfig.digits(**cfg, eps=1e-6)).eval()
    data = [(torch.randn(4, 1, 8, 8), torch.randint(0, 10, (4,)))]
    call = {"barrier": lambda: lf.barrier(a, b, data, 3), "interpolate": lambda: lf.interpolate([a, b], [0.5, 0.5]),
            "simplex": lambda: lf.simplex([a, b], data, n=2)}[entry]
    with pytest.raises(ValueError, match=r"models\[1\] does not fit: eps is 1e-06, models\[0\] has 1e-05"):
        call()


def test_save_refuses_an_alignment_load_would_refuse(tmp_path):
    """An element off its group (a tampered one) is refused before writing: no file that load rejects."""
    m = tiny_gpt2()
    al = Alignment.random(canonical_spec(standard_params(m)[0]), seed=1)
    al.elements["mlp.0"]["perm"][0] = al.elements["mlp.0"]["perm"][1]  # not a bijection any more
    with pytest.raises(InvalidAlignmentError, match="not a bijection"):
        al.save(tmp_path / "bad.safetensors")
    assert not (tmp_path / "bad.safetensors").exists()


def test_an_alignment_in_a_folder_whose_name_is_not_utf8_loads(tmp_path):
    import os

    m = tiny_gpt2()
    al = Alignment.random(canonical_spec(standard_params(m)[0]), seed=2)
    good = tmp_path / "a.safetensors"
    al.save(good)
    folder = os.path.join(os.fsencode(tmp_path), b"caf\xe9")
    os.mkdir(folder)
    target = os.path.join(folder, b"a.safetensors")
    os.rename(os.fsencode(good), target)
    back = Alignment.load(os.fsdecode(target))
    assert all(torch.equal(back.elements[n][k], v) for n, el in al.elements.items() for k, v in el.items())
