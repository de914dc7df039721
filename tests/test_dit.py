"""DiT (adaLN-Zero diffusion Transformers): the reference model against a plain DiT written out here, its
symmetry group (what is exact, and what is not), the canonical form's removal of the per-channel
modulation and gate scales, planted recovery by every matcher, the denoising task and its checks, training
and sampling. Tiny models in float64."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import lmc_fast as lf
from lmc_fast.diffusion import DenoisingBatches, Schedule, sample, train_dit
from lmc_fast.models import DiT, DiTConfig
from lmc_fast.models import functional as Fn
from lmc_fast.models.adapters import adapter_for, standard_params
from lmc_fast.models.arch import Arch
from lmc_fast.models.functional_dit import MODULATIONS, pack_inputs, unpack_inputs
from lmc_fast.symmetry import Alignment, canonical_params, canonical_spec, permutation_spec
from lmc_fast.symmetry import elements as E
from lmc_fast.symmetry.maps import centred_orthogonal
from lmc_fast.symmetry.spec import Group

SMALL = dict(d_model=32, n_layer=2, n_head=4, d_mlp=48, freq_dim=16)


def random_dit(seed=0, **overrides) -> DiT:
    """A DiT in float64 with every parameter random (adaLN-Zero starts the modulations at zero)."""
    torch.manual_seed(seed)
    m = DiT(DiTConfig.tiny(**{**SMALL, **overrides})).double()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=g, dtype=torch.float64))
    return m.eval()


def batches(n=2, batch=8, seed=0, classes=10):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n * batch, 1, 8, 8, generator=g, dtype=torch.float64) * 2 - 1
    y = torch.randint(0, classes, (n * batch,), generator=g)
    return DenoisingBatches(x, y, batch_size=batch, seed=seed)


def predict(arch, params, inputs):
    return Fn.forward(arch, {k: v.unsqueeze(0) for k, v in params.items()}, inputs)[0]


def rel(a, b):
    return float((a - b).detach().norm() / b.detach().norm())


# ------------------------------------------------------------------ the model against a plain DiT
def plain_dit(p: dict, cfg: DiTConfig, x_t, t, y):
    """DiT as its authors write it: a strided conv for the patches, one Linear(d, 6d) per block for
    adaLN's chunks, explicit softmax attention, unpatchify at the end."""
    d, P, C, H = cfg.d_model, cfg.patch_size, cfg.channels, cfg.n_head
    x = F.conv2d(x_t, p["patch_embed.weight"].reshape(d, C, P, P), p["patch_embed.bias"], stride=P)
    x = x.flatten(2).transpose(1, 2) + p["pos_embed"]
    half = cfg.freq_dim // 2
    freqs = torch.exp(-math.log(10000) * torch.arange(half, dtype=torch.float64) / half)
    args = t.double()[:, None] * freqs[None]
    tf = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
    c = F.linear(F.silu(F.linear(tf, p["t_embed.fc1.weight"], p["t_embed.fc1.bias"])), p["t_embed.fc2.weight"],
                 p["t_embed.fc2.bias"]) + p["y_embed.weight"][y]
    ln = lambda h: F.layer_norm(h, (d,), eps=cfg.eps)  # noqa: E731
    for l in range(cfg.n_layer):
        b = f"blocks.{l}."
        W6 = torch.cat([p[b + f"mod.{n}.weight"] for n in MODULATIONS])
        b6 = torch.cat([p[b + f"mod.{n}.bias"] for n in MODULATIONS])
        s1, sc1, g1, s2, sc2, g2 = F.linear(F.silu(c), W6, b6).unsqueeze(1).chunk(6, dim=-1)
        h = ln(x) * (1 + sc1) + s1
        q, k, v = (F.linear(h, p[b + f"attn.{n}.weight"], p[b + f"attn.{n}.bias"]) for n in "qkv")
        split = lambda z: z.reshape(z.shape[0], z.shape[1], H, d // H).transpose(1, 2)  # noqa: E731
        att = torch.softmax(split(q) @ split(k).transpose(-1, -2) / math.sqrt(d // H), dim=-1) @ split(v)
        x = x + g1 * F.linear(att.transpose(1, 2).reshape(x.shape), p[b + "attn.o.weight"], p[b + "attn.o.bias"])
        h = ln(x) * (1 + sc2) + s2
        m = F.gelu(F.linear(h, p[b + "mlp.fc1.weight"], p[b + "mlp.fc1.bias"]), approximate="tanh")
        x = x + g2 * F.linear(m, p[b + "mlp.fc2.weight"], p[b + "mlp.fc2.bias"])
    shift = F.linear(F.silu(c), p["final.shift.weight"], p["final.shift.bias"]).unsqueeze(1)
    scale = F.linear(F.silu(c), p["final.scale.weight"], p["final.scale.bias"]).unsqueeze(1)
    out = F.linear(ln(x) * (1 + scale) + shift, p["out.weight"], p["out.bias"])
    side = cfg.image_size // P
    return out.reshape(len(x), side, side, C, P, P).permute(0, 3, 1, 4, 2, 5).reshape(len(x), C, side * P, side * P)


def test_the_dit_equals_a_plain_dit_written_out():
    m = random_dit()
    inputs, _ = next(iter(batches()))
    x_t, t, y = unpack_inputs(inputs)
    want = plain_dit(dict(m.named_parameters()), m.config, x_t, t, y)
    assert rel(m(inputs), want) < 1e-12
    assert rel(m.predict_noise(x_t, t, y), want) < 1e-12


def test_packing_round_trips_and_the_model_refuses_unpacked_images():
    x = torch.randn(4, 1, 8, 8, dtype=torch.float64)
    t, y = torch.tensor([0, 5, 500, 999]), torch.tensor([0, 3, 9, 10])
    x2, t2, y2 = unpack_inputs(pack_inputs(x, t, y))
    assert torch.equal(x2, x) and torch.equal(t2.long(), t) and torch.equal(y2, y)
    with pytest.raises(ValueError, match=r"packed inputs of shape \(B, 3, 8, 8\)"):
        random_dit()(x)


def test_config_refuses_bad_sizes_before_allocating():
    with pytest.raises(ValueError, match="image_size 9 is not divisible by patch_size 2"):
        DiTConfig(image_size=9)
    with pytest.raises(ValueError, match="d_model=30 is not divisible by n_head=4"):
        DiTConfig(d_model=30)
    with pytest.raises(ValueError, match="even freq_dim"):
        DiTConfig(freq_dim=15)
    with pytest.raises(ValueError, match="describes about"):
        DiTConfig(d_model=1 << 16, d_mlp=1 << 16, n_layer=64)


def test_adaln_zero_initialisation_makes_every_block_the_identity():
    m = DiT(DiTConfig.tiny(**SMALL)).double()
    inputs, _ = next(iter(batches()))
    h = []
    arch, p = standard_params(m)
    Fn.forward(arch, {k: v.unsqueeze(0) for k, v in p.items()}, inputs, record=lambda n, t: h.append((n, t)))
    resid = [t for n, t in h if n.startswith("resid.")]
    assert all(torch.equal(r, resid[0]) for r in resid)
    assert m(inputs).abs().max() == 0  # the zero output layer


def test_arch_round_trips_through_a_file_header_and_refuses_bad_conditioning():
    arch = random_dit().arch()
    from dataclasses import asdict

    assert Arch.from_dict(asdict(arch)) == arch
    with pytest.raises(ValueError, match="conditioning is 'film'"):
        Arch.from_dict({**asdict(arch), "conditioning": "film"})
    with pytest.raises(ValueError, match="freq_dim is 3"):
        Arch.from_dict({**asdict(arch), "freq_dim": 3})
    with pytest.raises(ValueError, match="conditioning 'adaln' is supported for pre-norm"):
        Arch.from_dict({**asdict(arch), "residual": "parallel"})


# ------------------------------------------------------------------ the symmetry group
def test_canonical_form_keeps_the_function_and_is_idempotent():
    m = random_dit()
    arch, raw = standard_params(m)
    inputs, _ = next(iter(batches()))
    cp = canonical_params(arch, raw)
    assert rel(predict(arch, cp, inputs), predict(arch, raw, inputs)) < 1e-12
    again = canonical_params(arch, cp)
    assert max(float((again[k] - cp[k]).abs().max()) for k in cp) < 1e-12
    # the signs it chose: every modulated norm's gain 1 + scale bias positive, every gate's bias >= 0
    for l in range(arch.n_layer):
        for j in "12":
            assert (cp[f"blocks.{l}.mod.scale{j}.bias"] > -1).all() and (cp[f"blocks.{l}.mod.gate{j}.bias"] >= 0).all()
    assert (cp["final.scale.bias"] > -1).all()


@pytest.mark.parametrize("head_map", ["orthogonal", "invertible"])
def test_every_element_of_the_group_keeps_the_function(head_map):
    m = random_dit(1)
    arch, raw = standard_params(m)
    spec = canonical_spec(arch, head_map)
    assert {n: g.kind for n, g in spec.groups.items() if "." not in n} == {
        "cond": "permutation", "t_embed": "permutation", "residual": "permutation"}
    cp = canonical_params(arch, raw)
    inputs, _ = next(iter(batches()))
    g = Alignment.random(spec, seed=3)
    assert rel(predict(arch, g.apply_params(cp), inputs), predict(arch, cp, inputs)) < 1e-10
    # the raw-space group of the permutation baseline too, on raw parameters
    raw_g = Alignment.random(permutation_spec(arch), seed=4)
    assert rel(predict(arch, raw_g.apply_params(raw), inputs), predict(arch, raw, inputs)) < 1e-12


def scaled(arch, raw: dict, seed: int) -> dict:
    """raw with a random signed scale on every modulated norm's channels (against its readers) and on every
    gate's rows (against its branch's output rows): exact maps the group does not hold."""
    g = torch.Generator().manual_seed(seed)
    out = dict(raw)

    def factor():
        a = torch.empty(arch.d_model, dtype=torch.float64).uniform_(0.25, 4, generator=g)
        return a * torch.where(torch.rand(arch.d_model, generator=g) < 0.5, -1.0, 1.0)

    branches = [(f"blocks.{l}.mod.shift{j}", f"blocks.{l}.mod.scale{j}",
                 [f"blocks.{l}.attn.{n}" for n in "qkv"] if j == "1" else [f"blocks.{l}.mlp.fc1"])
                for l in range(arch.n_layer) for j in "12"] + [("final.shift", "final.scale", ["out"])]
    for shift, scale, readers in branches:
        a = factor()
        out[scale + ".weight"] = raw[scale + ".weight"] * a[:, None]
        out[scale + ".bias"] = a * (1 + raw[scale + ".bias"]) - 1
        out[shift + ".weight"], out[shift + ".bias"] = raw[shift + ".weight"] * a[:, None], raw[shift + ".bias"] * a
        for r in readers:
            out[r + ".weight"] = raw[r + ".weight"] / a[None, :]
    for l in range(arch.n_layer):
        for gate, writer in ((f"blocks.{l}.mod.gate1", f"blocks.{l}.attn.o"), (f"blocks.{l}.mod.gate2", f"blocks.{l}.mlp.fc2")):
            a = factor()
            for t in (".weight", ".bias"):
                shape = (-1, 1) if t == ".weight" else (-1,)
                out[gate + t] = raw[gate + t] * a.reshape(shape)
                out[writer + t] = raw[writer + t] / a.reshape(shape)
    return out


def test_modulation_and_gate_scales_are_exact_and_the_canonical_form_removes_them():
    m = random_dit(2)
    arch, raw = standard_params(m)
    inputs, _ = next(iter(batches()))
    moved = scaled(arch, raw, seed=5)
    assert rel(predict(arch, moved, inputs), predict(arch, raw, inputs)) < 1e-12
    assert max(float((moved[k] - raw[k]).abs().max()) for k in raw) > 0.1  # they did move
    ca, cm = canonical_params(arch, raw), canonical_params(arch, moved)
    assert max(float((ca[k] - cm[k]).abs().max()) for k in ca) < 1e-10


def test_the_canonical_form_commutes_with_the_group():
    m = random_dit(3)
    arch, raw = standard_params(m)
    g = Alignment.random(canonical_spec(arch), seed=7)
    left, right = canonical_params(arch, g.apply_params(raw)), g.apply_params(canonical_params(arch, raw))
    assert max(float((left[k] - right[k]).abs().max()) for k in left) < 1e-10


def _acting(spec, name: str, kind: str) -> Group:
    g = spec.groups[name]
    return Group(name, kind, g.size, g.axes, role=g.role)


@pytest.mark.parametrize("what", ["centred rotation of the stream", "sign flip of a stream channel",
                                  "sign flip of a conditioning channel", "rotation of the conditioning"])
def test_maps_beyond_the_group_change_the_function(what):
    """The stream's group is the permutations: LayerNorm commutes with rotations keeping the ones vector, but
    adaLN's per-channel scale and shift and the gates do not, and a sign flip breaks LayerNorm's centring;
    silu(c) allows no more than permutations of c."""
    m = random_dit(4)
    arch, raw = standard_params(m)
    spec = canonical_spec(arch)
    cp = canonical_params(arch, raw)
    d = arch.d_model
    g = torch.Generator().manual_seed(0)
    name = "residual" if "stream" in what else "cond"
    if "rotation" in what:
        Q = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))[0]
        M = centred_orthogonal(torch.linalg.qr(Q[1:, 1:])[0]) if name == "residual" else Q
    else:
        M = torch.eye(d, dtype=torch.float64)
        M[3, 3] = -1
    group = _acting(spec, name, "orthogonal")
    moved = dict(cp)
    for ax in group.axes:
        moved[ax.param] = E.apply_axis(cp[ax.param], group, ax, {"matrix": M})
    inputs, _ = next(iter(batches()))
    assert rel(predict(arch, moved, inputs), predict(arch, cp, inputs)) > 1e-3


# ------------------------------------------------------------------ planted recovery
def planted_pair(seed=5):
    """(A, B) with B = g . A for a random element g of the whole group, plus random modulation and gate
    scales (which the canonical form removes)."""
    a = random_dit(seed)
    arch, raw = standard_params(a)
    g = Alignment.random(canonical_spec(arch), seed=seed + 1)
    b = adapter_for(a).build(a, g.apply_params(scaled(arch, raw, seed + 2)))
    return a, b, g


def _same_canonical(a, b, tol):
    arch, pa = standard_params(a)
    ca, cb = canonical_params(arch, pa), canonical_params(arch, standard_params(b)[1])
    return max(float((ca[k] - cb[k]).abs().max()) for k in ca) < tol


@pytest.mark.parametrize("method", ["weight", "activation"])
def test_matching_recovers_a_planted_dit_exactly(method):
    a, b, g = planted_pair()
    al = lf.align(a, b, method, **({"data": batches(3, 16)} if method == "activation" else {}))
    inverse = g.inverse()
    for name in al.spec.groups:  # every permutation (stream, conditioning, timestep MLP, heads, MLP units)
        assert torch.equal(al.elements[name]["perm"], inverse.elements[name]["perm"]), name
    assert _same_canonical(a, al.apply(b), 1e-9)
    assert lf.barrier(a, al.apply(b), batches(), lambdas=5).barrier < 1e-10


def test_the_permutation_baseline_recovers_a_planted_raw_permutation():
    a = random_dit(6)
    arch, raw = standard_params(a)
    g = Alignment.random(permutation_spec(arch), seed=2)
    b = adapter_for(a).build(a, g.apply_params(raw))
    al = lf.align(a, b, "permutation")
    aligned = standard_params(al.apply(b))[1]
    assert max(float((aligned[k] - raw[k]).abs().max()) for k in raw) < 1e-12


def test_the_permutation_baseline_does_not_undo_the_scales():
    """The negative control: on raw parameters the modulation and gate scales stay, so B scaled is not A."""
    a = random_dit(7)
    arch, raw = standard_params(a)
    b = adapter_for(a).build(a, scaled(arch, raw, 1))
    aligned = standard_params(lf.align(a, b, "permutation").apply(b))[1]
    assert max(float((aligned[k] - raw[k]).abs().max()) for k in raw) > 0.1


def test_learned_matching_lowers_a_planted_barrier_and_returns_a_symmetry():
    from lmc_fast.match.learned import exact_alignment, learn_alignments

    a = random_dit(8).float()
    arch, raw = standard_params(a)
    spec = canonical_spec(arch)
    b = Alignment.random(spec, seed=6).apply(a)
    data = list(batches(6, 8, seed=1))
    data = [(x.float(), y.float()) for x, y in data]
    pa, pb = canonical_params(arch, raw), canonical_params(arch, standard_params(b)[1])
    hard, info = learn_alignments(spec, [pa, pb], [Alignment.identity(spec).elements], data[:5], data[5:],
                                  steps=40, lr=0.02, eval_every=10, patience=10, lam="uniform")
    assert info["val_barrier"] < info["val_history"][0][1]
    al = exact_alignment(spec, hard[0], {}).validate()
    x, _ = data[0]
    assert rel(al.apply(b)(x), b(x)) < 1e-4


def test_learned_matching_refuses_targets_that_are_not_the_noise():
    a, b, _ = planted_pair()
    with pytest.raises(ValueError, match="learns on its own task, the noise"):
        lf.align(a, b, "learned", data=list(batches()), target="endpoints", steps=2)


# ------------------------------------------------------------------ the task, sweeps and checks
def test_denoising_batches_are_the_same_on_every_pass_and_differ_by_seed():
    data = batches(3)
    first, second = list(data), list(data)
    assert all(torch.equal(x1, x2) and torch.equal(e1, e2) for (x1, e1), (x2, e2) in zip(first, second))
    other = list(batches(3, seed=1))
    assert not torch.equal(first[0][1], other[0][1])
    x_t, t, _ = unpack_inputs(first[0][0])
    assert t.min() >= 0 and t.max() < Schedule().steps and torch.equal(t, t.round())


def test_the_barrier_is_the_noise_mse_and_the_engines_agree():
    a, b = random_dit(9), random_dit(10)
    data = batches()
    res = lf.barrier(a, b, data, lambdas=5, space="raw")
    loop = lf.barrier(a, b, data, lambdas=5, space="raw", engine="loop")
    assert max(abs(x - y) for x, y in zip(res.loss, loop.loss)) < 1e-9
    with torch.no_grad():
        mse = sum(float(((a(x) - e) ** 2).mean((1, 2, 3)).sum()) for x, e in data) / 16
    assert abs(res.loss_a - mse) < 1e-10 and res.acc_barrier is None
    assert lf.evaluate(a, data)["loss"] == pytest.approx(mse, rel=1e-10)


@pytest.mark.parametrize("bad, message", [
    (lambda x, e: (x[:, :1], e), "must be packed"),
    (lambda x, e: (torch.cat([x[:, :1], x[:, 1:2] + torch.arange(8.0, dtype=x.dtype), x[:, 2:]], 1), e),
     "timestep plane is not one whole number"),
    (lambda x, e: (torch.cat([x[:, :1], x[:, 1:2] * 0 + 1000, x[:, 2:]], 1), e), "timestep 1000 is outside"),
    (lambda x, e: (torch.cat([x[:, :2], x[:, 2:] * 0 + 11], 1), e), "class 11 is outside"),
    (lambda x, e: (x, e[:, :, :4]), "targets must be the noise"),
    (lambda x, e: (x, e.long()), "targets must be the noise"),
    (lambda x, e: (x, e * float("nan")), "noise. hold NaN"),
    (lambda x, e: (x * float("nan"), e), "hold NaN or infinite"),
])
def test_bad_denoising_batches_are_refused_in_one_line(bad, message):
    a = random_dit(11)
    x, e = next(iter(batches()))
    with pytest.raises(ValueError, match=message):
        lf.barrier(a, a, [bad(x, e)], lambdas=3)


def test_training_lowers_the_loss_and_sampling_is_deterministic():
    torch.manual_seed(0)
    m = DiT(DiTConfig.tiny(**SMALL))
    g = torch.Generator().manual_seed(0)
    x = torch.rand(64, 1, 8, 8, generator=g) * 2 - 1
    y = torch.randint(0, 10, (64,), generator=g)
    losses = train_dit(m, x, y, steps=60, batch_size=32, lr=3e-3, warmup=5)
    assert sum(losses[-10:]) / 10 < 0.7 * sum(losses[:10]) / 10
    s1, s2 = sample(m, torch.arange(4), steps=5, seed=3), sample(m, torch.arange(4), steps=5, seed=3)
    assert s1.shape == (4, 1, 8, 8) and torch.equal(s1, s2) and torch.isfinite(s1).all()
    assert s1.abs().max() <= 1  # the last step returns the clipped estimate of x_0
    assert not torch.equal(sample(m, torch.arange(4), steps=5, seed=3, clip=False), s1)
    assert not torch.equal(s1, sample(m, torch.arange(4), steps=5, seed=4))
    with pytest.raises(ValueError, match="train_dit trains lmc_fast.models.DiT"):
        train_dit(torch.nn.Linear(2, 2), x, y, steps=1)


def test_save_load_round_trips_and_the_cli_aligns_two_dit_folders(tmp_path):
    from lmc_fast.cli import main
    from lmc_fast.io import load_model, save_model

    a, b, g = planted_pair()
    save_model(a, tmp_path / "a"), save_model(b, tmp_path / "b")
    back = load_model(tmp_path / "a")
    assert isinstance(back, DiT) and all(torch.equal(p, q) for p, q in zip(a.state_dict().values(),
                                                                             back.state_dict().values()))
    assert back.pos_embed.requires_grad is False
    # the CLI loads DiTs whole (they do not stream) and finds the planted element
    assert main(["align", str(tmp_path / "a"), str(tmp_path / "b"), "--method", "weight", "--out",
                 str(tmp_path / "al.safetensors")]) == 0
    al = Alignment.load(tmp_path / "al.safetensors")
    assert torch.equal(al.elements["residual"]["perm"], g.inverse().elements["residual"]["perm"])


def test_dit_checkpoints_are_not_streamed_and_say_so(tmp_path):
    from lmc_fast.io import save_model

    a, b, _ = planted_pair()
    save_model(a, tmp_path / "a"), save_model(b, tmp_path / "b")
    with pytest.raises(lf.UnsupportedModelError, match="DiT cannot be streamed .DiT's conditioning vector"):
        lf.align(str(tmp_path / "a"), str(tmp_path / "b"), "weight")


def test_layer_groups_that_share_a_parameter_are_solved_in_rounds():
    """cond and t_embed both act on t_embed.fc2 (its rows and its columns): weight matching solves them in
    successive rounds, each given the other's element; a ViT's layer groups are all disjoint: one round."""
    from lmc_fast.match.weight import disjoint_rounds
    from lmc_fast.models import ViT, ViTConfig

    spec = canonical_spec(random_dit().arch())
    local = [n for n, g in spec.groups.items() if g.layer_local]
    rounds = disjoint_rounds(spec, local)
    assert len(rounds) == 2 and "cond" in rounds[0] and rounds[1] == ["t_embed"]
    vit = canonical_spec(standard_params(ViT(ViTConfig.digits()))[0])
    assert len(disjoint_rounds(vit, [n for n, g in vit.groups.items() if g.layer_local])) == 1


def test_the_cli_sweep_refuses_classification_data_for_a_dit_in_one_line(tmp_path, capsys):
    from lmc_fast.cli import main
    from lmc_fast.io import save_model

    a, b, _ = planted_pair()
    save_model(a.float(), tmp_path / "a"), save_model(b.float(), tmp_path / "b")
    rc = main(["sweep", str(tmp_path / "a"), str(tmp_path / "b"), "--data", "digits", "--out", str(tmp_path / "r.json")])
    err = capsys.readouterr().err
    assert rc == 2 and "DiT inputs must be packed" in err and "DenoisingBatches" in err and "Traceback" not in err
    assert not (tmp_path / "r.json").exists()
