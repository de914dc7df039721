"""Mamba (Hugging Face's MambaForCausalLM): the adapter, the one functional forward, every reparameterisation
found exact (each proved in float64) and those that are not (each shown to change the function), the
canonical form that takes the continuous ones out, planted recovery by weight, activation, learned and
permutation matching, barrier sweeps, files and the command line. Tiny models in float64.

Hugging Face's Mamba computes its RMSNorm, A = -exp(A_log) and the logits in float32 even in a float64
model; `hf_float64` lifts those casts (the same code otherwise), so its logits and ours agree to 1e-10."""
from __future__ import annotations

import contextlib
import warnings

import pytest
import torch

import lmc_fast as lf
from lmc_fast.io import load_model, save_model
from lmc_fast.models import functional as Fn
from lmc_fast.models.adapters import HFMambaAdapter, UnsupportedModelError, adapter_for, standard_params
from lmc_fast.models.arch import Arch
from lmc_fast.symmetry import Alignment, canonical_params, canonical_spec, permutation_spec
from lmc_fast.symmetry import elements as E

transformers = pytest.importorskip("transformers")
modeling_mamba = pytest.importorskip("transformers.models.mamba.modeling_mamba")

VOCAB, T = 48, 12
D_MODEL, STATE, RANK = 16, 4, 3  # d_inner 32 (expand 2), conv kernel 4
#: HF's own float32 casts (norms, A, logits): its unpatched logits agree to ~1e-7
HF_ATOL = 1e-5


def hf_mamba(seed: int = 0, dtype=torch.float64, **overrides):
    base = dict(vocab_size=VOCAB, hidden_size=D_MODEL, state_size=STATE, num_hidden_layers=2, expand=2,
                conv_kernel=4, time_step_rank=RANK, residual_in_fp32=False, use_cache=False)
    base.update(overrides)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.manual_seed(seed)
        model = transformers.MambaForCausalLM(transformers.MambaConfig(**base))
    gen = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():  # norms, biases, A and D away from their initial values too
        for name, p in model.named_parameters():
            if p.dim() == 1 or name.endswith("A_log"):
                p.add_(0.3 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return model.to(dtype).eval()


def ids(seed: int = 0, batch: int = 3, length: int = T):
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def fl(arch, params, x):
    """Logits of the one functional forward on standard parameters."""
    return Fn.forward(arch, {k: v.unsqueeze(0) for k, v in params.items()}, x)[0]


def max_diff(a, b) -> float:
    return (a - b).abs().max().item()


@contextlib.contextmanager
def hf_float64():
    """Hugging Face's Mamba with its float32 casts lifted: `.float()` keeps a float64 tensor, the RMSNorm
    normalises in the input's dtype (the same formula)."""
    to_float = torch.Tensor.float

    def keep64(self, *args, **kwargs):
        return self if self.dtype == torch.float64 else to_float(self, *args, **kwargs)

    def rms(self, h):
        return self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))

    norm = modeling_mamba.MambaRMSNorm.forward
    torch.Tensor.float, modeling_mamba.MambaRMSNorm.forward = keep64, rms
    try:
        yield
    finally:
        torch.Tensor.float, modeling_mamba.MambaRMSNorm.forward = to_float, norm


def hf_logits(model, x):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return adapter_for(model).logits(model, x)


CASES = {"default": dict(), "projection-biases": dict(use_bias=True), "no-conv-bias": dict(use_conv_bias=False),
         "untied": dict(tie_word_embeddings=False), "one-layer-wide-state": dict(num_hidden_layers=1, state_size=8)}


# ---------------------------------------------------------------- the adapter and the forward
@pytest.mark.parametrize("case", CASES)
def test_hugging_face_mamba_equals_the_functional_forward_and_rebuilds_exactly(case):
    m = hf_mamba(**CASES[case])
    arch, p = standard_params(m)
    x = ids()
    ours = fl(arch, p, x)
    with hf_float64():
        theirs = hf_logits(m, x)
    assert theirs.dtype == torch.float64 and max_diff(ours, theirs) < 1e-10
    assert max_diff(ours, hf_logits(m, x)) < HF_ATOL  # HF's own float32 casts
    back = adapter_for(m).build(m, p)
    assert list(back.state_dict()) == list(m.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(m.state_dict().values(), back.state_dict().values()))
    assert (arch.d_inner, arch.d_state, arch.dt_rank, arch.d_conv) == (2 * D_MODEL, m.config.state_size, RANK, 4)
    assert arch.conv_bias == m.config.use_conv_bias and arch.proj_bias == m.config.use_bias


def test_the_fused_projections_are_cut_in_their_stored_order():
    """in_proj's rows are [x; z], x_proj's [dt; B; C]; conv1d is stored (d_inner, 1, k)."""
    m = hf_mamba()
    p = HFMambaAdapter().get(m)
    mixer = m.backbone.layers[1].mixer
    E_ = 2 * D_MODEL
    assert torch.equal(p["blocks.1.mamba.in_x.weight"], mixer.in_proj.weight[:E_])
    assert torch.equal(p["blocks.1.mamba.in_z.weight"], mixer.in_proj.weight[E_:])
    W = mixer.x_proj.weight
    assert torch.equal(p["blocks.1.mamba.x_dt.weight"], W[:RANK])
    assert torch.equal(p["blocks.1.mamba.x_B.weight"], W[RANK:RANK + STATE])
    assert torch.equal(p["blocks.1.mamba.x_C.weight"], W[RANK + STATE:])
    assert torch.equal(p["blocks.1.mamba.conv.weight"], mixer.conv1d.weight[:, 0])


@pytest.mark.parametrize("case", ["default", "projection-biases"])
def test_layout_and_export_make_the_state_dict_back(case):
    """What streamed reads and writes use: the layout's cuts and the export's joins invert each other."""
    m = hf_mamba(**CASES[case])
    ad, state = HFMambaAdapter(), m.state_dict()
    p = ad.get(m)
    assert set(ad.layout(m)) == set(p)
    for key, e in ad.export(m).items():
        made = p[e.names[0]] if e.make is None else e.make(*(p[n] for n in e.names))
        assert torch.equal(made, state[key]), key


@pytest.mark.parametrize("overrides,message", [(dict(hidden_act="relu"), "hidden_act='relu' is not supported")])
def test_unsupported_mamba_settings_are_refused_in_one_line(overrides, message):
    m = hf_mamba(**overrides)
    with pytest.raises(UnsupportedModelError, match=message) as err:
        standard_params(m)
    assert "\n" not in str(err.value)


def test_mamba_pairs_of_different_inner_widths_are_refused():
    a, b = hf_mamba(), hf_mamba(seed=1, expand=1)
    with pytest.raises(UnsupportedModelError, match="different intermediate_size") as err:
        lf.align(a, b, "weight")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("field,value,message", [("mixer", "ssm", "mixer is 'ssm'"), ("d_state", -1, "d_state is -1"),
                                                 ("conv_bias", 1, "conv_bias is 1"), ("dt_rank", 0, "must be positive"),
                                                 ("norm", "layernorm", "mixer 'mamba' is supported for")])
def test_a_mamba_arch_read_from_a_file_is_checked(field, value, message):
    from dataclasses import asdict

    d = asdict(standard_params(hf_mamba())[0])
    assert Arch.from_dict(d) == standard_params(hf_mamba())[0]
    with pytest.raises(ValueError, match=message):
        Arch.from_dict({**d, field: value})


# ---------------------------------------------------------------- the symmetries, exact and not
def _model_and_canonical(seed=0, **overrides):
    m = hf_mamba(seed, **overrides)
    arch, raw = standard_params(m)
    return arch, raw, canonical_params(arch, raw)


def _scaled(p: dict, l: int, name: str, rows: torch.Tensor, axis: int = 0) -> None:
    """p[name] of block l with its slices along `axis` multiplied by `rows`, in place."""
    key = f"blocks.{l}.mamba.{name}"
    shape = [1] * p[key].dim()
    shape[axis] = -1
    p[key] = p[key] * rows.reshape(shape)


def _signed_scales(n, gen):
    """n scales in +-[1/4, 4], some negative."""
    s = torch.exp((torch.rand(n, generator=gen, dtype=torch.float64) * 2 - 1) * 1.386)
    return s * torch.where(torch.rand(n, generator=gen) < 0.4, -1.0, 1.0).double()


def removed_maps(arch, p: dict, gen) -> dict:
    """p moved by every exact map the canonical form takes out, and by norm scales it folds: per block a
    signed scale per inner channel (in_x rows / conv rows), per state (x_B rows / x_C rows), a GL(dt_rank)
    map of dt's factors, and a positive RMSNorm scale (the readers' columns divided by it); the same for ln_f."""
    p = dict(p)
    for l in range(arch.n_layer):
        b = f"blocks.{l}.mamba."
        s = _signed_scales(arch.d_inner, gen)
        _scaled(p, l, "in_x.weight", s), _scaled(p, l, "conv.weight", 1 / s)
        if arch.proj_bias:
            _scaled(p, l, "in_x.bias", s)
        s = _signed_scales(arch.d_state, gen)
        _scaled(p, l, "x_B.weight", s), _scaled(p, l, "x_C.weight", 1 / s)
        M = torch.eye(arch.dt_rank, dtype=torch.float64) + 0.5 * torch.randn(arch.dt_rank, arch.dt_rank, generator=gen,
                                                                               dtype=torch.float64)
        p[b + "x_dt.weight"] = M @ p[b + "x_dt.weight"]
        p[b + "dt.weight"] = p[b + "dt.weight"] @ torch.linalg.inv(M)
    for norm, readers in (*((f"blocks.{l}.ln1", [f"blocks.{l}.mamba.in_x", f"blocks.{l}.mamba.in_z"])
                            for l in range(arch.n_layer)), ("ln_f", ["lm_head"])):
        gamma = 0.5 + 1.5 * torch.rand(arch.d_model, generator=gen, dtype=torch.float64)
        p[norm + ".weight"] = p[norm + ".weight"] * gamma
        for r in readers:
            p[r + ".weight"] = p[r + ".weight"] / gamma
    return p


def test_the_maps_the_canonical_form_removes_keep_the_function():
    """Signed channel scales (in_x row a, conv row 1 / a: the conv is linear, its bias added after), signed state
    scales (B row a, C row 1 / a: A is diagonal), GL(dt_rank) on dt's two factors and the norms' scales:
    exact in float64, and every one really moved the parameters."""
    arch, raw, _ = _model_and_canonical(**CASES["projection-biases"])
    moved = removed_maps(arch, raw, torch.Generator().manual_seed(1))
    assert all((moved[k] - raw[k]).abs().max() > 1e-2 for k in moved if "mamba" in k and
               k.split(".")[-2] in ("in_x", "conv", "x_B", "x_C", "x_dt", "dt") and k.endswith("weight"))
    x = ids(1)
    assert max_diff(fl(arch, moved, x), fl(arch, raw, x)) < 1e-10


@pytest.mark.parametrize("group", ["residual", "inner.0", "state.1", "all"])
def test_rotations_of_the_stream_and_permutations_of_channels_and_states_keep_the_function(group):
    """On canonical parameters (the norms folded): a residual rotation; a permutation of the inner channels
    (in_x / in_z rows, conv, x_proj columns, dt rows, A_log rows, D, out columns); of the states (B and C rows,
    A_log columns); all of them together."""
    arch, raw, c = _model_and_canonical(**CASES["projection-biases"])
    spec = canonical_spec(arch)
    gen = torch.Generator().manual_seed(2)
    names = list(spec.groups) if group == "all" else [group]
    els = {n: E.random_element(spec.groups[n], gen) for n in names}
    moved = E.apply_spec(spec, c, els)
    x = ids(2)
    assert max(max_diff(moved[k], c[k]) for k in c) > 1e-2
    assert max_diff(fl(arch, moved, x), fl(arch, raw, x)) < 1e-10


def test_raw_space_permutations_keep_the_function():
    arch, raw, _ = _model_and_canonical()
    spec = permutation_spec(arch)
    gen = torch.Generator().manual_seed(3)
    moved = E.apply_spec(spec, raw, {n: E.random_element(g, gen) for n, g in spec.groups.items()})
    x = ids(3)
    assert max_diff(fl(arch, moved, x), fl(arch, raw, x)) < 1e-10


def mixer_out(arch, p, x):
    """What block 0's Mamba mixer adds to the stream."""
    ops = Fn.StackedOps(arch, {k: v.unsqueeze(0) for k, v in p.items()})
    h = Fn.embed(arch, ops.p, x)
    return Fn.block(arch, ops, 0, h) - h


def _inner_orthogonal(arch, c, l, Q):
    """Every inner-channel axis of block l moved by the orthogonal Q, as a permutation moves them."""
    p = dict(c)
    group = canonical_spec(arch).groups[f"inner.{l}"]
    for ax in group.axes:
        t = p[ax.param].movedim(ax.axis, 0)
        t = (Q @ t.reshape(t.shape[0], -1)).reshape(t.shape)
        p[ax.param] = t.movedim(0, ax.axis)
    return p


def test_what_is_not_a_symmetry_changes_the_function():
    """Each broken by a nonlinearity in the way: a channel's gate row against its out column (silu(z)); a
    rotation of the inner channels (silu after the conv, softplus, the elementwise scan); a rotation of the
    states (A is diagonal per state: exp(dt A) does not commute with it); dt scaled against A and D with
    out's column undone (exact were dt linear: softplus is not); a residual rotation of raw parameters (the
    RMSNorm scales not folded); a negative channel scale against out's column (silu is not odd)."""
    arch, raw, c = _model_and_canonical()
    # steps dt of order one and larger B, C (HF starts dt at 1e-3..1e-1, where exp(dt A) is near 1 for every
    # state, and the scan's share is small beside D u): rotating the states is not a symmetry either way, but
    # it is plainly visible in this block
    c["blocks.0.mamba.dt.bias"] = c["blocks.0.mamba.dt.bias"] + 5
    for n in ("x_B.weight", "x_C.weight"):
        c[f"blocks.0.mamba.{n}"] = 4 * c[f"blocks.0.mamba.{n}"]
    x, gen = ids(4), torch.Generator().manual_seed(4)
    base, mixed = fl(arch, c, x), mixer_out(arch, c, x)
    broken = {}
    p = dict(c)
    s = 0.5 + torch.rand(arch.d_inner, generator=gen, dtype=torch.float64)
    _scaled(p, 0, "in_z.weight", s), _scaled(p, 0, "out.weight", 1 / s, axis=1)
    broken["gate row / out column"] = p
    broken["inner rotation"] = _inner_orthogonal(arch, c, 0, E.random_orthogonal(arch.d_inner, gen))
    p = dict(c)
    Q = E.random_orthogonal(arch.d_state, gen)
    for n in ("x_B.weight", "x_C.weight"):
        p[f"blocks.0.mamba.{n}"] = Q @ p[f"blocks.0.mamba.{n}"]
    broken["state rotation"] = p
    p = dict(c)
    k = 2.0
    _scaled(p, 0, "dt.weight", torch.full((arch.d_inner,), k)), _scaled(p, 0, "dt.bias", torch.full((arch.d_inner,), k))
    p["blocks.0.mamba.A_log"] = p["blocks.0.mamba.A_log"] - torch.log(torch.tensor(k))
    _scaled(p, 0, "D", torch.full((arch.d_inner,), k)), _scaled(p, 0, "out.weight", torch.full((arch.d_inner,), 1 / k), 1)
    broken["dt scale against A, D and out"] = p
    spec = canonical_spec(arch)
    broken["residual rotation, raw"] = E.apply_spec(spec, raw, {"residual": E.random_element(spec.groups["residual"],
                                                                                             gen)})
    p = dict(c)
    sign = torch.ones(arch.d_inner, dtype=torch.float64)
    sign[::2] = -1
    _scaled(p, 0, "in_x.weight", sign), _scaled(p, 0, "conv.weight", sign), _scaled(p, 0, "out.weight", sign, 1)
    broken["negative channel scale against out"] = p
    for what, p in broken.items():  # block 0's output (the logits for the raw rotation) moves by a percent or more
        if what.startswith("residual"):
            assert max_diff(fl(arch, p, x), base) > 1e-2 * base.abs().max().item(), what
        else:
            assert max_diff(mixer_out(arch, p, x), mixed) > 1e-2 * mixed.abs().max().item(), what


# ---------------------------------------------------------------- the canonical form
def test_the_canonical_form_keeps_the_function_is_idempotent_and_unties_the_head():
    arch, raw, c = _model_and_canonical()
    x = ids(5)
    assert max_diff(fl(arch, c, x), fl(arch, raw, x)) < 1e-10
    again = canonical_params(arch, c)
    assert max(max_diff(again[k], c[k]) for k in c) < 1e-12
    assert all(torch.equal(c[f"blocks.{l}.ln1.weight"], torch.ones(arch.d_model)) for l in range(arch.n_layer))
    assert not torch.equal(c["lm_head.weight"], c["tok_embed.weight"])
    b = lf.to_canonical(hf_mamba())
    assert not b.config.tie_word_embeddings and max_diff(hf_logits(b, x), hf_logits(hf_mamba(), x)) < HF_ATOL
    # balanced: in_x's and conv's rows of equal norms, the conv rows' sums positive; B's and C's rows equal norms
    m = "blocks.1.mamba."
    assert torch.allclose(c[m + "in_x.weight"].norm(dim=1), c[m + "conv.weight"].norm(dim=1), rtol=1e-12)
    assert (c[m + "conv.weight"].sum(1) > 0).all() and (c[m + "x_B.weight"].sum(1) > 0).all()
    assert torch.allclose(c[m + "x_B.weight"].norm(dim=1), c[m + "x_C.weight"].norm(dim=1), rtol=1e-12)
    Wt = c[m + "dt.weight"]  # dt's factors: U S^1/2 (orthogonal columns) and S^1/2 V^T
    gram = Wt.T @ Wt
    assert max_diff(gram, torch.diag(torch.diagonal(gram))) < 1e-12


@pytest.mark.parametrize("case", ["default", "projection-biases"])
def test_the_canonical_form_is_equivariant(case):
    """canonical(g . A) = g' . canonical(A): g any element of the full group (rotation, permutations, every
    removed map), g' its rotation and permutations."""
    arch, raw, c = _model_and_canonical(**CASES[case])
    spec = canonical_spec(arch)
    g = Alignment.random(spec, seed=7).elements
    moved = E.apply_spec(spec, c, g)  # g' . canonical(A)
    scrambled = removed_maps(arch, E.apply_spec(spec, c, g), torch.Generator().manual_seed(8))
    got = canonical_params(arch, scrambled)
    assert max(max_diff(got[k], moved[k]) / moved[k].abs().max().item() for k in moved) < 1e-10


# ---------------------------------------------------------------- planted recovery
def planted_pair(seed=10, dtype=torch.float64, **overrides):
    """(A, B, g'): B = g . A for g a random residual rotation, inner-channel and state permutation of every
    block, plus every map the canonical form removes and norm scales; g' the rotation and permutations."""
    a = hf_mamba(seed, dtype=dtype, **overrides)
    arch, _ = standard_params(a)
    truth = Alignment.random(canonical_spec(arch), seed=seed + 1)
    b = truth.apply(a)
    _, pb = standard_params(b)
    moved = removed_maps(arch, {k: v.double() for k, v in pb.items()}, torch.Generator().manual_seed(seed + 2))
    return a, adapter_for(b).build(b, {k: v.to(dtype) for k, v in moved.items()}), truth


def _recovered(al, a, b, truth, tol=1e-8):
    inv = truth.inverse()
    for name, group in al.spec.groups.items():
        if group.kind == "permutation":
            assert torch.equal(al[name]["perm"], inv[name]["perm"]), name
        else:
            assert max_diff(al[name]["matrix"], inv[name]["matrix"]) < tol, name
    arch, pa = standard_params(a)
    want = canonical_params(arch, pa)
    got = canonical_params(arch, standard_params(al.apply(b))[1])
    assert max(max_diff(got[k], want[k]) / want[k].abs().max().item() for k in want) < tol


@pytest.mark.parametrize("case", ["default", "projection-biases"])
def test_weight_matching_recovers_a_planted_element_exactly(case):
    a, b, truth = planted_pair(**CASES[case])
    _recovered(lf.align(a, b, "weight"), a, b, truth)


def test_activation_matching_recovers_a_planted_element_exactly():
    """The statistics: the stream at every block boundary, the inner channels u (conv output) and the state
    maps B and C; canonical B's are A's moved by the permutations alone."""
    a, b, truth = planted_pair(seed=12)
    data = [(ids(s, batch=8), None) for s in range(4)]
    _recovered(lf.align(a, b, "activation", data=data), a, b, truth)
    _recovered(lf.align(a, b, "activation", data=data, residual_only=True), a, b, truth)


def test_the_permutation_baseline_recovers_a_raw_permutation_and_not_the_full_group():
    a = hf_mamba(13)
    arch, _ = standard_params(a)
    truth = Alignment.random(permutation_spec(arch), seed=14)
    b = truth.apply(a)
    al = lf.align(a, b, "permutation")
    assert al.spec.space == "raw"
    assert all(torch.equal(al[n]["perm"], truth.inverse()[n]["perm"]) for n in al.spec.groups)
    pa, pb = standard_params(a)[1], standard_params(al.apply(b))[1]
    assert all(torch.equal(pa[k], pb[k]) for k in pa)
    # the negative control: the full group's plant (rotation, scales) is out of its reach
    a, b, _ = planted_pair(seed=15)
    pa, pb = standard_params(a)[1], standard_params(lf.align(a, b, "permutation").apply(b))[1]
    assert max(max_diff(pa[k], pb[k]) for k in pa) > 1e-2


def _sharp_mamba_and_its_text(seed: int, batches: int = 6):
    """A float32 Mamba with a sharp head (lm_head x 8: a random model's logits are near uniform, and then
    any mixture beats the chord) and greedy continuations of random prompts, which it predicts well: data
    on which a misaligned midpoint has a real barrier."""
    m = hf_mamba(seed, tie_word_embeddings=False)
    with torch.no_grad():
        m.lm_head.weight.mul_(8)
    m = m.float()
    arch, p = standard_params(m)
    p1 = {k: v.unsqueeze(0) for k, v in p.items()}
    data = []
    for s in range(batches):
        x = ids(s, batch=8, length=2)
        while x.shape[1] < T:
            x = torch.cat([x, Fn.forward(arch, p1, x)[0][:, -1:].argmax(-1)], dim=1)
        data.append((x, x))
    return m, data


def test_learned_matching_returns_an_exact_symmetry_and_lowers_a_planted_barrier():
    """From the identity, learned matching (40 steps, float32) lowers the validation barrier of (A, g . A)
    and what it returns is a symmetry of B (its function kept)."""
    from lmc_fast.match.learned import exact_alignment, learn_alignments

    torch.manual_seed(0)
    a, data = _sharp_mamba_and_its_text(16)
    arch, raw = standard_params(a)
    spec = canonical_spec(arch)
    b = Alignment.random(spec, seed=6).apply(a)
    pa, pb = canonical_params(arch, raw), canonical_params(arch, standard_params(b)[1])
    hard, info = learn_alignments(spec, [pa, pb], [Alignment.identity(spec).elements], data[:5], data[5:],
                                  steps=40, lr=0.02, eval_every=10, patience=10, target="endpoints", lam="uniform")
    assert info["val_history"][0][1] > 0.05  # the planted pair's barrier is real ...
    assert info["val_barrier"] < info["val_history"][0][1]  # ... and learned matching lowers it
    al = exact_alignment(spec, hard[0], {}).validate()
    x = ids(9)
    assert max_diff(hf_logits(al.apply(b), x), hf_logits(b, x)) < 1e-4 * hf_logits(b, x).abs().max().item()


# ---------------------------------------------------------------- sweeps, files, the command line
def _loss(model, x):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return model(input_ids=x, labels=x, use_cache=False).loss.item()


def test_a_barrier_sweep_of_two_mambas_ends_at_their_own_losses():
    a, b = hf_mamba(17), hf_mamba(18)
    data = [(ids(s, batch=4), ids(s, batch=4)) for s in range(2)]
    res = lf.barrier(a, b, data, lambdas=5, space="raw")
    want_a = sum(_loss(a, x) for x, _ in data) / len(data)
    want_b = sum(_loss(b, x) for x, _ in data) / len(data)
    assert res.loss_a == pytest.approx(want_a, rel=1e-6) and res.loss_b == pytest.approx(want_b, rel=1e-6)
    assert res.loss[0] == pytest.approx(want_a, rel=1e-6) and res.loss[-1] == pytest.approx(want_b, rel=1e-6)
    loop = lf.barrier(a, b, data, lambdas=3, space="raw", engine="loop")
    assert loop.loss[1] == pytest.approx(res.loss[2], rel=1e-6)  # lambda 0.5, both engines
    al = lf.align(a, b, "weight")
    aligned = lf.barrier(a, b, data, lambdas=3, align=al)
    assert aligned.loss_b == pytest.approx(want_b, rel=1e-6)  # aligned B: B's function


def test_a_mamba_folder_saves_loads_and_aligns_on_the_command_line_streamed(tmp_path, capsys):
    """`lmc-fast align` on two Hugging Face folders streams them (a tensor at a time through the layout) and
    finds what matching the models in memory finds: the planted element; streamed activation matching too."""
    from lmc_fast.cli import main

    a, b, truth = planted_pair(seed=19, dtype=torch.float32)
    pa, pb = save_model(a, tmp_path / "a"), save_model(b, tmp_path / "b")
    again = load_model(pa)
    assert type(again).__name__ == "MambaForCausalLM"
    x = ids(6)
    assert max_diff(hf_logits(again, x), hf_logits(a, x)) == 0
    rc = main(["align", str(pa), str(pb), "--method", "weight", "--out", str(tmp_path / "w.safetensors"), "-q"])
    assert rc == 0, capsys.readouterr().err
    al = Alignment.load(tmp_path / "w.safetensors")
    in_memory = lf.align(a, b, "weight")
    for name, group in al.spec.groups.items():
        if group.kind == "permutation":
            assert torch.equal(al[name]["perm"], truth.inverse()[name]["perm"]), name
            assert torch.equal(al[name]["perm"], in_memory[name]["perm"]), name
        else:
            assert max_diff(al[name]["matrix"], in_memory[name]["matrix"]) < 1e-5
    data = [(ids(s, batch=8),) * 2 for s in range(3)]
    act, act_streamed = lf.align(a, b, "activation", data=data), lf.align(pa, pb, "activation", data=data)
    assert act_streamed.info["streamed"]
    for name, group in act.spec.groups.items():  # streamed activation matching: the inner and state groups too
        if group.kind == "permutation":
            assert torch.equal(act_streamed[name]["perm"], act[name]["perm"]), name
            assert torch.equal(act[name]["perm"], truth.inverse()[name]["perm"]), name
    aligned = al.apply(load_model(pb))
    assert max_diff(hf_logits(aligned, x), hf_logits(b, x)) < 1e-4  # a symmetry of B
    assert max_diff(hf_logits(aligned, x), hf_logits(a, x)) < 1e-3  # ... which is A's function


def test_the_streamed_sweep_and_the_lerp_kernel_run_the_mixer_as_the_batched_engine_does(tmp_path):
    """The conv, A_log and D are mixed through each engine's ops (`tensor`): a layer-streamed barrier of two
    folders and the Triton lerp path (CPU interpreter here) give the in-memory batched engine's losses."""
    from zoo import lerp_kernel_matches_batched

    a, b = hf_mamba(20, dtype=torch.float32), hf_mamba(21, dtype=torch.float32)
    data = [(ids(s, batch=4), ids(s, batch=4)) for s in range(2)]
    pa, pb = save_model(a, tmp_path / "a"), save_model(b, tmp_path / "b")
    streamed = lf.barrier(pa, pb, data, lambdas=3, space="raw")
    in_memory = lf.barrier(a, b, data, lambdas=3, space="raw")
    assert streamed.streamed is not None
    assert streamed.loss == pytest.approx(in_memory.loss, rel=1e-5)
    lerp_kernel_matches_batched([a, b], data[0], "cpu", 1e-4)
