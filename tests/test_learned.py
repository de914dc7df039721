"""Learned matching: projections are exact group elements with useful gradients, every
step's alignment preserves the function, and the loop lowers the barrier."""
import pytest
import torch

import lmc_fast as lf
from lmc_fast.match.learned import exact_alignment, learn_alignments, sample_weights
from lmc_fast.match.kinds.base import _ExactPolar, polar_ste_newton_schulz
from lmc_fast.match.projection import Latents, apply_dense, newton_schulz_polar, polar_ste
from lmc_fast.symmetry.groups import Permutation
from lmc_fast.models.adapters import standard_params
from lmc_fast.symmetry import Alignment, canonical_params, canonical_spec
from lmc_fast.symmetry.elements import apply_spec
from zoo import learned_lowers_a_planted_barrier, logits, make_inputs, make_model, rel_err, same_elements


def test_newton_schulz_matches_the_polar_factor():
    gen = torch.Generator().manual_seed(0)
    Q, _ = torch.linalg.qr(torch.randn(5, 12, 12, generator=gen, dtype=torch.float64))
    M = Q + 0.2 * torch.randn(5, 12, 12, generator=gen, dtype=torch.float64)
    U, S, Vh = torch.linalg.svd(M)
    ns = newton_schulz_polar(M, S[:, 0], steps=30)
    assert (ns - U @ Vh).abs().max() < 1e-8


def _svd_polar_gradient(M, target):
    """The polar factor's gradient by autograd through the SVD (exact where singular values are distinct)."""
    M = M.detach().clone().requires_grad_()
    U, _, Vh = torch.linalg.svd(M)
    ((U @ Vh) * target).sum().backward()
    return M.grad


def _rel(a, b):
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("noise", [0.01, 0.3, 1.0])
def test_polar_ste_forward_is_exact_and_its_gradient_is_the_polar_factors(noise):
    gen = torch.Generator().manual_seed(int(100 * noise))
    M = (torch.eye(8, dtype=torch.float64) + noise * torch.randn(3, 8, 8, generator=gen, dtype=torch.float64)).requires_grad_()
    R = polar_ste(M)
    U, _, Vh = torch.linalg.svd(M.detach())
    assert (R.detach() - U @ Vh).abs().max() < 1e-10
    target = torch.randn(3, 8, 8, generator=gen, dtype=torch.float64)
    (R * target).sum().backward()
    assert _rel(M.grad, _svd_polar_gradient(M, target)) < 1e-9


def test_exact_polar_gradient_passes_gradcheck_and_float32_follows_it():
    gen = torch.Generator().manual_seed(7)
    M = (torch.eye(6, dtype=torch.float64) + 0.5 * torch.randn(2, 6, 6, generator=gen, dtype=torch.float64)).requires_grad_()
    assert torch.autograd.gradcheck(_ExactPolar.apply, (M,))
    target = torch.randn(2, 6, 6, generator=gen, dtype=torch.float64)
    M32 = M.detach().float().requires_grad_()
    (polar_ste(M32) * target.float()).sum().backward()
    assert M32.grad.dtype == torch.float32
    assert _rel(M32.grad.double(), _svd_polar_gradient(M, target)) < 1e-5


def test_newton_schulz_gradient_holds_for_well_conditioned_latents_only():
    """The CUDA path's gradient (products only): exact at the conditioning learned runs reach (condition
    numbers up to about 5 after 600 steps on the tiny LLaMAs, docs/ARCHITECTURE.md 3), wrong at condition
    100, where ten iterations do not converge; which is why the CPU takes the exact gradient."""
    gen = torch.Generator().manual_seed(3)
    errors = {}
    for condition in (5.0, 100.0):
        Q1, _ = torch.linalg.qr(torch.randn(4, 8, 8, generator=gen, dtype=torch.float64))
        Q2, _ = torch.linalg.qr(torch.randn(4, 8, 8, generator=gen, dtype=torch.float64))
        s = torch.logspace(0, -torch.log10(torch.tensor(condition)).item(), 8, dtype=torch.float64)
        M = Q1 @ torch.diag(s) @ Q2.transpose(-1, -2)
        target = torch.randn(4, 8, 8, generator=gen, dtype=torch.float64)
        Mg = M.clone().requires_grad_()
        (polar_ste_newton_schulz(Mg, Q1 @ Q2.transpose(-1, -2)) * target).sum().backward()
        errors[condition] = _rel(Mg.grad, _svd_polar_gradient(M, target))
    assert errors[5.0] < 1e-6
    assert errors[100.0] > 0.1


def test_exact_polar_gradient_of_a_singular_latent_is_finite():
    gen = torch.Generator().manual_seed(4)
    M = torch.randn(2, 6, 6, generator=gen, dtype=torch.float64)
    M[:, :, :2] = 0.0  # rank 4: two zero singular values
    M.requires_grad_()
    (polar_ste(M) * torch.randn(2, 6, 6, generator=gen, dtype=torch.float64)).sum().backward()
    assert torch.isfinite(M.grad).all()


def test_polar_ste_refuses_a_non_finite_latent_in_one_line():
    M = torch.eye(4).unsqueeze(0).clone()
    M[0, 1, 2] = float("nan")
    with pytest.raises(ValueError, match="NaN or inf"):
        polar_ste(M.requires_grad_())


def test_one_hot_rows_gather_has_the_products_values_and_gradients():
    gen = torch.Generator().manual_seed(5)
    perm = torch.randperm(9, generator=gen)
    latent = torch.randn(9, 9, generator=gen, dtype=torch.float64)
    flat = torch.randn(9, 7, generator=gen, dtype=torch.float64)
    cot = torch.randn(9, 7, generator=gen, dtype=torch.float64)
    hard = torch.zeros(9, 9, dtype=torch.float64).scatter_(-1, perm.unsqueeze(-1), 1.0)
    outs = []
    for use_gather in (False, True):
        L, F = latent.clone().requires_grad_(), flat.clone().requires_grad_()
        P = hard + (L - L.detach())
        dense = {"P": P, "perm": perm} if use_gather else {"P": P}
        out = Permutation().apply_dense(F, None, None, dense)
        (out * cot).sum().backward()
        outs.append((out.detach(), L.grad, F.grad))
    for product, gathered in zip(*outs):
        assert torch.equal(product, gathered)


def test_learned_steps_with_gathers_equal_those_with_permutation_products(monkeypatch):
    """Applying the permutations as gathers changes no step: the latents after a few Adam steps are equal."""
    a, b = make_model("gpt2", seed=61, dtype=torch.float32), make_model("gpt2", seed=62, dtype=torch.float32)
    x = make_inputs("gpt2")
    latents = []
    for product in (True, False):
        if product:
            monkeypatch.setattr(Permutation, "apply_dense", lambda self, flat, g, ax, dense: dense["P"] @ flat)
        else:
            monkeypatch.undo()
        la = lf.LearnedAlignment(a, b, "identity")
        opt = torch.optim.Adam([p for p in la.parameters() if p.requires_grad], lr=0.05)
        for lam in (0.3, 0.5, 0.7):
            loss = la(x, lam=lam).logsumexp(-1).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        latents.append([p.detach().clone() for p in la.parameters()])
    assert all(torch.equal(u, v) for u, v in zip(*latents))


@pytest.mark.parametrize("head_map", ["orthogonal", "invertible"])
def test_projected_elements_preserve_function_at_every_step(head_map):
    a = make_model("gpt2", seed=51, dtype=torch.float32)
    arch, raw = standard_params(a)
    spec = canonical_spec(arch, head_map)
    pa = canonical_params(arch, raw)
    lat = Latents(spec, Alignment.random(spec, seed=2).elements)
    opt = torch.optim.Adam(lat.parameters(), lr=0.05)
    x = make_inputs("gpt2")
    pa32 = {k: v.float() for k, v in pa.items()}
    for step in range(4):  # random walks of the latents: each projection must stay exact
        dense, hard = lat.project()
        moved_dense = apply_dense(spec, pa32, dense)
        moved_hard = apply_spec(spec, pa, hard)
        for k in pa:
            assert (moved_dense[k].double() - moved_hard[k]).abs().max() < 1e-4, k
        b = exact_alignment(spec, hard, {}).apply(a)  # float32-accurate maps snapped onto the groups
        assert rel_err(logits(b, x), logits(a, x)) < 1e-4
        loss = sum((v * torch.randn_like(v)).sum() for v in moved_dense.values())
        opt.zero_grad()
        loss.backward()
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in lat.parameters())
        opt.step()


def test_latent_projection_warm_start_matches_cold_solves():
    """Each step's assignment starts from the previous step's prices; the permutations must
    reach the same optimum as a cold solve of the same latents at every step."""
    import lmc_fast.kernels as K

    a = make_model("vit", seed=52, dtype=torch.float32, d_mlp=40)
    arch, _ = standard_params(a)
    spec = canonical_spec(arch)
    lat = Latents(spec, Alignment.random(spec, seed=3).elements)
    first = None
    for step in range(5):
        _, hard = lat.project()
        mlp = lat.blocks["mlp"]
        if K.has_ext():
            assert mlp.warm["duals"].shape == (len(mlp.names), 40)
        cold = K.linear_assignment_reference(mlp.perm.detach())
        warm = torch.stack([hard[n]["perm"] for n in mlp.names])
        torch.testing.assert_close(K.assignment_objective(mlp.perm.detach(), warm),
                                   K.assignment_objective(mlp.perm.detach(), cold), rtol=0, atol=1e-6)
        first = warm if first is None else first
        with torch.no_grad():  # a random walk big enough to change the assignment
            for p in lat.parameters():
                p.add_(0.3 * torch.randn_like(p))
    assert not torch.equal(warm, first)  # the walk did move the optimum


def test_sample_weights_modes():
    gen = torch.Generator().manual_seed(0)
    w = sample_weights("narrow", 2, 100, gen)
    assert torch.allclose(w.sum(1), torch.ones(100, dtype=torch.float64))
    assert (w[:, 1] >= 0.4).all() and (w[:, 1] <= 0.6).all()
    assert (sample_weights("fixed", 2, 3, gen)[:, 1] == 0.5).all()
    u = sample_weights("uniform", 2, 200, gen)[:, 1]
    assert u.min() < 0.1 and u.max() > 0.9
    m = sample_weights("mixed", 2, 4000, gen)[:, 1]
    near = ((m >= 0.4) & (m <= 0.6)).double().mean()
    # half the draws from U[0.4, 0.6], half from U[0, 1] (a fifth of which lands there too): 0.6 expected
    assert 0.56 < near < 0.64 and m.min() < 0.05 and m.max() > 0.95
    again = [sample_weights("mixed", 2, 50, torch.Generator().manual_seed(3)) for _ in range(2)]
    assert torch.equal(*again)  # the generator alone decides, so resumed runs draw the same lambdas
    d = sample_weights("narrow", 3, 50, gen)
    assert d.shape == (50, 3) and torch.allclose(d.sum(1), torch.ones(50, dtype=torch.float64))
    with pytest.raises(ValueError):
        sample_weights("bogus", 2, 1, gen)


@pytest.mark.parametrize("sides", ["b", "both"])
def test_learned_matching_lowers_a_planted_barrier(sides):
    """B is A under a random symmetry plus noise; starting from a deliberately poor alignment
    (identity), learned matching must lower the validation barrier, with B's elements alone
    learning or both models' (LMC-DM)."""
    torch.manual_seed(0)
    a = make_model("vit", seed=61, dtype=torch.float32)
    arch, raw = standard_params(a)
    spec = canonical_spec(arch)
    b = Alignment.random(spec, seed=5).apply(a)
    data = [(make_inputs("vit", seed=s, batch=16, dtype=torch.float32),
             torch.randint(0, 5, (16,), generator=torch.Generator().manual_seed(s))) for s in range(6)]
    with torch.no_grad():  # label the data with A so the task is A's function
        data = [(x, logits(a, x).argmax(-1)) for x, _ in data]
    pa, pb = canonical_params(arch, raw), canonical_params(arch, standard_params(b)[1])
    hard, info = learn_alignments(spec, [pa, pb], [Alignment.identity(spec).elements], data[:5], data[5:],
                                  steps=60, lr=0.02, eval_every=20, patience=10, sides=sides)
    hist = [v for _, v in info["val_history"]]
    assert info["sides"] == sides and info["val_barrier"] < hist[0]
    assert min(hist) == info["val_barrier"]


def test_align_learned_api_returns_alignment():
    a, b = make_model("vit", seed=71, dtype=torch.float32), make_model("vit", seed=72, dtype=torch.float32)
    data = [(make_inputs("vit", seed=s, batch=8, dtype=torch.float32),
             torch.randint(0, 5, (8,), generator=torch.Generator().manual_seed(s))) for s in range(4)]
    al = lf.align(a, b, "learned", data=data, steps=10, eval_every=5)
    assert isinstance(al, Alignment) and al.info["method"] == "learned" and al.info["steps"] == 10
    x = make_inputs("vit", dtype=torch.float32)
    assert rel_err(logits(al.apply(b), x), logits(b, x)) < 1e-4
    with pytest.raises(ValueError, match="at least 2 batches"):
        lf.align(a, b, "learned", data=data[:1], steps=2)


def test_learned_merge_keeps_functions():
    from lmc_fast.match.learned_merge import learned_merge

    models = [make_model("vit", seed=s, dtype=torch.float32) for s in (81, 82, 83)]
    data = [(make_inputs("vit", seed=s, batch=8, dtype=torch.float32),
             torch.randint(0, 5, (8,), generator=torch.Generator().manual_seed(s))) for s in range(4)]
    merged, alignments = learned_merge(models, data, steps=6, eval_every=3, target="endpoints")
    assert len(merged) == 3 and alignments[1].info["method"] == "learned"
    x = make_inputs("vit", dtype=torch.float32)
    for m, orig in zip(merged, models):
        assert rel_err(logits(m, x), logits(orig, x)) < 1e-4


def test_learn_residual_only_keeps_other_groups_at_their_init():
    a, b = make_model("vit", seed=91, dtype=torch.float32), make_model("vit", seed=92, dtype=torch.float32)
    data = [(make_inputs("vit", seed=s, batch=8, dtype=torch.float32),
             torch.randint(0, 5, (8,), generator=torch.Generator().manual_seed(s))) for s in range(4)]
    init = lf.align(a, b, "weight")
    al = lf.align(a, b, "learned", data=data, steps=8, eval_every=2, lr=0.05, init=init, learn="residual")
    for name, group in al.spec.groups.items():
        if name == "residual":
            continue
        assert torch.equal(al[name]["perm"], init[name]["perm"]), name
        if group.kind == "heads":
            assert torch.allclose(al[name]["qk"], init[name]["qk"], atol=1e-5), name
    moved = al.info["moved"]  # the way travelled: only the residual's rotation may move
    assert set(moved) == {"residual", "mlp", "heads"} and moved["residual"]["matrix"] >= 0
    assert moved["mlp"]["perm"] == moved["heads"]["perm"] == 0.0 and moved["heads"]["qk"] < 1e-5
    assert moved == lf.match.learned_module.moved_from(al, init)
    with pytest.raises(ValueError, match="learn must be one of"):
        lf.align(a, b, "learned", data=data, steps=1, init=init, learn="nothing")


def test_both_sides_reach_the_paths_of_one_side():
    """sides="both" moves A too. The group acts linearly on the parameters, so the mixture
    (1 - w) g_A . A + w g_B . B is g_A applied to the one-sided mixture with g_A^-1 g_B: the same
    function at every mixing weight (float64), and that element is what `hard_elements` reports."""
    from lmc_fast.match.learned_module import mix
    from lmc_fast.models import functional as Fn

    a, b = make_model("gpt2", seed=111, dtype=torch.float64), make_model("gpt2", seed=112, dtype=torch.float64)
    la = lf.LearnedAlignment(a, b, init="weight", sides="both", dtype=torch.float64)
    assert {n.split(".")[0] for n, _ in la.named_parameters()} == {"latents", "reference"}
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():  # every latent, A's too, well away from its start
        for p in la.parameters():
            p.add_(0.5 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    ref = Alignment(la.spec, la.reference.project()[1])
    assert ref.distance(Alignment.identity(la.spec))["residual"]["matrix"] > 0.1  # A's element really moved
    pa, pb = la.params_list
    composed = Alignment(la.spec, la.hard_elements()[0])
    one_sided = [pa, composed.apply_params(pb)]
    x = make_inputs("gpt2")
    w = torch.tensor([[1.0, 0.0], [0.7, 0.3], [0.5, 0.5], [0.2, 0.8], [0.0, 1.0]], dtype=torch.float64)
    want = Fn.forward(la.arch, {k: mix(w, [p[k] for p in one_sided]) for k in pa}, x)
    assert rel_err(la.mixture_logits(x, w), want) < 1e-8
    # and the ends are still the two models' functions
    assert rel_err(la(x, lam=0.0), logits(a, x)) < 1e-8 and rel_err(la(x, lam=1.0), logits(b, x)) < 1e-8
    al = la.alignment()
    assert al.info["sides"] == "both" and rel_err(logits(al.apply(b), x), logits(b, x)) < 1e-8


def test_align_learned_with_both_sides_and_a_bad_sides_value():
    a, b, data = _vit_pair_and_data(113, 114)
    al = lf.align(a, b, "learned", data=data, steps=6, eval_every=3, lr=0.05, sides="both")
    assert al.info["sides"] == "both" and al.info["steps"] == 6 and set(al.info["moved"]) == {"residual", "mlp", "heads"}
    x = make_inputs("vit", dtype=torch.float32)
    assert rel_err(logits(al.apply(b), x), logits(b, x)) < 1e-4
    with pytest.raises(ValueError, match="sides must be one of"):
        lf.align(a, b, "learned", data=data, steps=1, sides="a")


def _vit_pair_and_data(seed_a, seed_b):
    a, b = make_model("vit", seed=seed_a, dtype=torch.float32), make_model("vit", seed=seed_b, dtype=torch.float32)
    data = [(make_inputs("vit", seed=s, batch=8, dtype=torch.float32),
             torch.randint(0, 5, (8,), generator=torch.Generator().manual_seed(s))) for s in range(4)]
    return a, b, data


def test_endpoint_target_with_mixup_learns_a_function_preserving_alignment():
    from lmc_fast.data.augment import Mixup

    a, b, data = _vit_pair_and_data(101, 102)
    al = lf.align(a, b, "learned", data=data, steps=6, eval_every=3, lr=0.05, target="endpoints", temperature=2.0,
                  augment=Mixup(1.0))
    assert al.info["target"] == "endpoints" and al.info["temperature"] == 2.0 and "Mixup" in al.info["augment"]
    x = make_inputs("vit", dtype=torch.float32)
    assert rel_err(logits(al.apply(b), x), logits(b, x)) < 1e-4
    with pytest.raises(ValueError, match="target='endpoints'"):
        lf.align(a, b, "learned", data=data, steps=1, target="labels", augment=Mixup(1.0))
    with pytest.raises(ValueError, match="target must be one of"):
        lf.align(a, b, "learned", data=data, steps=1, target="teacher")


def test_endpoint_target_is_the_mixture_of_end_model_distributions():
    """The distillation target at mixing weights w is sum_n w_n softmax(z_n / T)."""
    from lmc_fast.match.learned_targets import mixed_endpoint_probs
    from lmc_fast.models import functional as Fn

    a, b, _ = _vit_pair_and_data(103, 104)
    arch, pa = standard_params(a)
    pb = standard_params(b)[1]
    x = make_inputs("vit", dtype=torch.float32)
    w = torch.tensor([[0.3, 0.7], [1.0, 0.0]])
    got = mixed_endpoint_probs(arch, Fn.stack([pa, pb]), w, x, temperature=3.0)
    za, zb = logits(a, x).float(), logits(b, x).float()
    want0 = 0.3 * torch.softmax(za / 3, -1) + 0.7 * torch.softmax(zb / 3, -1)
    assert torch.allclose(got[0], want0, atol=1e-5) and torch.allclose(got[1], torch.softmax(za / 3, -1), atol=1e-5)


def test_endpoint_target_on_a_language_model():
    """Token logits (K, B, T, V): the distillation target and loss work per token."""
    a, b = make_model("gpt2", seed=105, dtype=torch.float32), make_model("gpt2", seed=106, dtype=torch.float32)
    data = [(make_inputs("gpt2", seed=s, batch=4),) * 2 for s in range(4)]
    al = lf.align(a, b, "learned", data=data, steps=4, eval_every=2, lr=0.05, target="endpoints", lam="uniform")
    assert al.info["steps"] == 4 and al.info["target"] == "endpoints"
    x = make_inputs("gpt2", seed=9)
    assert rel_err(logits(al.apply(b), x), logits(b, x)) < 1e-4


def _gpt2_learned(data, **kw):
    a, b = make_model("gpt2", seed=105, dtype=torch.float32), make_model("gpt2", seed=106, dtype=torch.float32)
    return lf.align(a, b, "learned", data=data, steps=9, eval_every=3, lr=0.05, target="endpoints", lam="uniform",
                    val_fraction=0.25, **kw)


def test_kept_end_model_targets_change_nothing_but_the_work(monkeypatch):
    """The end models' distributions kept per training batch give the very run recomputing them
    gives: the same elements and the same validation history, bit for bit; batches past the byte
    budget, and batches that are not the same tensor at the same place, are computed afresh."""
    import lmc_fast.match.learned_targets as targets_mod

    data = [(make_inputs("gpt2", seed=s, batch=4),) * 2 for s in range(4)]  # 3 training batches, 1 validation
    kept = _gpt2_learned(data)
    assert kept.info["targets_reused"] == 6  # 9 steps over 3 batches: the last two passes reuse the first's
    monkeypatch.setattr(targets_mod, "CACHE_BYTES", 0)
    fresh = _gpt2_learned(data)
    assert fresh.info["targets_reused"] == 0
    assert kept.info["val_history"] == fresh.info["val_history"]
    same_elements(kept, fresh)
    # a budget of one batch's distributions keeps that batch only
    a = make_model("gpt2", seed=105, dtype=torch.float32)
    one = 2 * logits(a, data[0][0]).numel() * 4  # N end models' float32 distributions on one batch
    monkeypatch.setattr(targets_mod, "CACHE_BYTES", one)
    assert _gpt2_learned(data).info["targets_reused"] == 2


def test_end_model_targets_are_reused_only_for_the_same_batch_tensor():
    """A batch replaced at its place (a fresh tensor, e.g. a re-iterable that re-draws) is never
    scored against the distributions kept for the old one; nothing is kept without `keep`."""
    from lmc_fast.match.learned_targets import EndpointTargets, mixed_endpoint_probs
    from lmc_fast.models import functional as Fn

    a, b = make_model("gpt2", seed=105, dtype=torch.float32), make_model("gpt2", seed=106, dtype=torch.float32)
    arch, pa = standard_params(a)
    ends = Fn.stack([pa, standard_params(b)[1]])
    w = torch.tensor([[0.25, 0.75]])
    x1, x2 = make_inputs("gpt2", seed=1, batch=2), make_inputs("gpt2", seed=2, batch=2)
    t = EndpointTargets(arch, ends, 1.0, keep=True)
    assert torch.equal(t.mixed(0, x1, x1, w), mixed_endpoint_probs(arch, ends, w, x1))
    assert torch.equal(t.mixed(0, x2, x2, w), mixed_endpoint_probs(arch, ends, w, x2)) and t.hits == 0
    assert torch.equal(t.mixed(0, x1, x1, w), mixed_endpoint_probs(arch, ends, w, x1)) and t.hits == 1
    off = EndpointTargets(arch, ends, 1.0, keep=False)
    off.mixed(0, x1, x1, w), off.mixed(0, x1, x1, w)
    assert off.hits == 0 and off.used == 0


def test_learned_alignment_module_in_a_plain_adam_loop_lowers_a_planted_barrier():
    """lf.LearnedAlignment is an nn.Module whose parameters are the latents: a user's own Adam
    loop on the midpoint loss lowers the barrier of a planted symmetry started from identity."""
    from lmc_fast.sweep.metrics import task_loss

    a = make_model("vit", seed=61, dtype=torch.float32)
    with torch.no_grad():  # larger weights: sharper logits, so the planted barrier is clear (~0.08)
        for p in a.parameters():
            if p.dim() == 2:
                p.mul_(3)
    spec = canonical_spec(standard_params(a)[0])
    b = Alignment.random(spec, seed=5).apply(a)  # A under a random symmetry: a zero barrier is reachable
    data = [(make_inputs("vit", seed=s, batch=16, dtype=torch.float32), None) for s in range(6)]
    with torch.no_grad():  # labelled by A, so the task is A's function
        data = [(x, logits(a, x).argmax(-1)) for x, _ in data]
    la = lf.LearnedAlignment(a, b, init="identity")
    assert {n for n, _ in la.named_parameters()} <= {"latents.0.blocks.mlp.perm", "latents.0.blocks.heads.perm",
                                                      "latents.0.blocks.heads.maps", "latents.0.blocks.residual.rotation"}
    assert set(la.state_dict()) == ({n for n, _ in la.named_parameters()}
                                    | {"latents.0.blocks.residual.Q"})  # no model weights
    x = data[0][0]
    assert rel_err(la(x, lam=0.0), logits(a, x)) < 1e-4 and rel_err(la(x, lam=1.0), logits(b, x)) < 1e-4
    assert la(x, lam=[0.0, 0.5, 1.0]).shape == (3, *logits(a, x).shape)
    before = lf.barrier(a, la.aligned_model(), data, lambdas=5).barrier

    torch.manual_seed(0)
    opt = torch.optim.Adam(la.parameters(), lr=0.02)
    for step in range(20):
        xb, yb = data[step % len(data)]
        loss = task_loss(la(xb, lam=0.4 + 0.2 * torch.rand(()).item()), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
    al = la.alignment()
    assert al.info["method"] == "learned" and al.info["init"] == "identity"
    assert rel_err(logits(al.apply(b), x), logits(b, x)) < 1e-4  # still B's function
    after = lf.barrier(a, la.aligned_model(), data, lambdas=5).barrier
    assert before > 0.05 and after < 0.25 * before, (before, after)
    with pytest.raises(ValueError, match="init must be"):
        lf.LearnedAlignment(a, b, init="nonsense")


def test_presets_fill_what_is_not_given():
    """preset="paper" (the paper's recipe), "distill" (end-model targets, no augmentation, lambda ~ U[0, 1]),
    "labels" (distill's settings with the task loss), "distill-loop" / "labels-loop" (those with the authors'
    loop: one lambda a step at twice the steps, AdamW weight decay 0.01, 5% warm-up, clip 1) and "default":
    distill-loop when the end models have memorised their training batches (loss < 0.05), else labels-loop; an
    explicit keyword wins over any preset; "auto" augmentation is Mixup for images with the end-model target and
    nothing for labels or token ids."""
    from lmc_fast.match.learned import MEMORISED_LOSS, PRESET_NAMES, PRESETS, default_preset, preset_settings

    assert default_preset(7e-4) == "distill-loop" and default_preset(0.55) == "labels-loop"
    assert default_preset(MEMORISED_LOSS) == "labels-loop"
    a, b, data = _vit_pair_and_data(103, 104)
    i = lf.align(a, b, "learned", data=data, steps=4, eval_every=2).info  # random models: far from memorised
    assert i["preset"] == "labels-loop" and i["end_models_training_loss"] > MEMORISED_LOSS
    assert (i["lr"], i["lam"], i["lambdas_per_step"], i["target"], i["augment"]) == (1e-2, "uniform", 1, "labels", None)
    assert (i["weight_decay"], i["warmup"], i["clip"]) == (0.01, 0.05, 1.0)
    p = lf.align(a, b, "learned", data=data, preset="paper", steps=4, eval_every=2).info
    assert (p["preset"], p["lr"], p["lam"], p["lambdas_per_step"], p["target"]) == ("paper", 3e-3, "narrow", 4, "labels")
    assert (p["weight_decay"], p["warmup"], p["clip"]) == (0.0, 0.0, None)
    d = lf.align(a, b, "learned", data=data, preset="distill", steps=4, eval_every=2).info
    assert (d["preset"], d["lr"], d["lam"], d["target"], d["val_fraction"]) == ("distill", 1e-2, "uniform", "endpoints", 0.2)
    assert d["augment"] is None and d["end_models_training_loss"] is None
    dl = lf.align(a, b, "learned", data=data, preset="distill-loop", steps=4, eval_every=2).info
    assert (dl["target"], dl["lambdas_per_step"], dl["weight_decay"], dl["clip"], dl["lr"]) == ("endpoints", 1, 0.01, 1.0, 3e-2)
    assert "Mixup" in lf.align(a, b, "learned", data=data, preset="distill", steps=2, eval_every=2,
                               augment="auto").info["augment"]  # asked for: Mixup on images
    assert lf.align(a, b, "learned", data=data, preset="paper", lr=0.02, steps=2, eval_every=2).info["lr"] == 0.02
    assert lf.align(a, b, "learned", data=data, preset="distill", steps=2, eval_every=2,
                    augment=None).info["augment"] is None
    assert set(PRESETS) == {"paper", "distill", "labels", "distill-loop", "labels-loop"}
    assert PRESET_NAMES == ("default", "paper", "distill", "labels", "distill-loop", "labels-loop")
    assert PRESETS["labels"] == {**PRESETS["distill"], "target": "labels"}
    loop = dict(steps=2000, lambdas_per_step=1, eval_every=200, weight_decay=0.01, warmup=0.05, clip=1.0)
    assert PRESETS["distill-loop"] == {**PRESETS["distill"], **loop, "lr": 3e-2}
    assert PRESETS["labels-loop"] == {**PRESETS["labels"], **loop}
    from lmc_fast.cli.align import PRESETS as CLI_PRESETS  # the command line's copy (it does not import torch)

    assert CLI_PRESETS == PRESET_NAMES
    from lmc_fast.cli.align import LAMBDA_MODES as CLI_LAMBDA_MODES
    from lmc_fast.match.options import LAMBDA_MODES
    assert CLI_LAMBDA_MODES == LAMBDA_MODES
    assert preset_settings("paper", steps=7)["steps"] == 7
    with pytest.raises(ValueError, match="preset must be one of"):
        lf.align(a, b, "learned", data=data, preset="fast")
    g1, g2 = make_model("gpt2", seed=1, dtype=torch.float32), make_model("gpt2", seed=2, dtype=torch.float32)
    tokens = [(make_inputs("gpt2", seed=s), make_inputs("gpt2", seed=s + 50)) for s in range(6)]
    lm = lf.align(g1, g2, "learned", data=tokens, preset="distill", steps=2, eval_every=2).info
    assert lm["augment"] is None and lm["init"] == "weight+token_prior"  # language models: the prior's start
    assert i["init"] == "weight"
    given = lf.align(g1, g2, "weight")
    assert lf.align(g1, g2, "learned", data=tokens, steps=2, eval_every=2, init=given).info["init"] == "weight"


def test_optimiser_options_warmup_clip_and_weight_decay():
    """The authors' optimiser (AdamW, weight decay 0.01, 5% warm-up, gradient clip 1) as options; bad
    values are one line each."""
    from lmc_fast.match.learned import _lr_factor

    assert [round(_lr_factor(s, 100, 0.05), 6) for s in (0, 4, 5)] == [0.2, 1.0, 1.0]
    assert _lr_factor(100, 100, 0.05) == 0.0 and _lr_factor(0, 100, 0.0) == 1.0
    a, b, data = _vit_pair_and_data(105, 106)
    info = lf.align(a, b, "learned", data=data, steps=4, eval_every=2, weight_decay=0.01, warmup=0.05, clip=1.0).info
    assert (info["weight_decay"], info["warmup"], info["clip"]) == (0.01, 0.05, 1.0)
    for bad, message in ((dict(weight_decay=-1), "weight_decay must be"), (dict(warmup=1.5), "warmup"),
                         (dict(clip=0), "clip")):
        with pytest.raises(ValueError, match=message):
            lf.align(a, b, "learned", data=data, steps=2, **bad)


@pytest.mark.parametrize("head_map", ["orthogonal", "invertible"])
def test_learned_matching_on_the_llama_family_lowers_a_planted_barrier(head_map):
    """Grouped-query heads, rotary QK maps, SwiGLU units: from the identity, learned matching lowers the
    validation barrier of a planted pair, and what it returns is a symmetry of B (B's function kept)."""
    learned_lowers_a_planted_barrier("llama", make_model("llama", seed=62, dtype=torch.float32), head_map)


def test_learned_matching_on_hugging_face_qwen2():
    """Multi-query attention with q/k/v biases, through lf.align: a symmetry of B comes back."""
    a, b = make_model("hf_qwen2", seed=63, dtype=torch.float32), make_model("hf_qwen2", seed=64, dtype=torch.float32)
    data = [(make_inputs("hf_qwen2", seed=s, batch=4),) * 2 for s in range(4)]
    al = lf.align(a, b, "learned", data=data, steps=4, eval_every=2, lr=0.05)
    assert al.info["steps"] == 4 and any(g.group_size == 4 for g in al.spec.groups.values() if g.kind == "heads")
    x = make_inputs("hf_qwen2", seed=9)
    assert rel_err(logits(al.apply(b), x), logits(b, x)) < 1e-4


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_cuda_learned_step_synchronises_only_for_the_assignment():
    """One learned-matching step on the GPU waits for the device only where the assignment copies
    its scores to the host solver and the indices back: torch's sync debug mode names every
    synchronising operation."""
    from lmc_fast.host_syncs import host_syncs
    from lmc_fast.match.learned import _mix
    from lmc_fast.models import functional as Fn
    from lmc_fast.sweep.metrics import task_loss
    from lmc_fast.symmetry.elements import identity

    torch.manual_seed(0)
    # heads of 32 (the CUDA polar kernel) and a residual of 127 (the asynchronous Newton iteration)
    cfg = lf.models.ViTConfig(d_model=128, n_head=4, d_mlp=96, n_layer=2)
    arch, ra = standard_params(lf.models.ViT(cfg))
    _, rb = standard_params(lf.models.ViT(cfg))
    spec = canonical_spec(arch)
    pa, pb = canonical_params(arch, ra), canonical_params(arch, rb)
    init = {n: identity(g) for n, g in spec.groups.items()}
    pa, pb = ({k: v.cuda().float() for k, v in p.items()} for p in (pa, pb))
    lat = Latents(spec, init).cuda()
    opt = torch.optim.Adam(lat.parameters(), lr=1e-3)
    x, y = torch.randn(8, 3, 32, 32, device="cuda"), torch.randint(0, 10, (8,), device="cuda")
    w = torch.tensor([[0.5, 0.5]], device="cuda")

    def step():
        moved = apply_dense(spec, pb, lat.project()[0])
        theta = {name: _mix(w, [pa[name], moved[name]]) for name in pa}
        loss = task_loss(Fn.forward(spec.arch, theta, x)[0], y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    step()
    sites = host_syncs(step)
    assert sites, "the assignment's copies should be seen"
    others = [s for s in sites if not (s and s[0].startswith("assignment.py:"))]
    assert not others, others


def test_host_syncs_names_the_frames_of_each_synchronising_operation(monkeypatch):
    """The CPU path of the GPU sync check: with the CUDA calls stubbed, each warning torch's sync debug
    mode would give becomes one entry of the matching frames, innermost first; other warnings are not
    syncs, and the debug mode is set back afterwards."""
    import warnings

    from lmc_fast.host_syncs import host_syncs

    modes = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", modes.append)

    def inner():
        warnings.warn("called a synchronizing CUDA operation")

    def outer():
        inner()
        warnings.warn("something else")
        inner()

    sites = host_syncs(outer, match=("test_learned",))
    warn_line, first_call, second_call = (inner.__code__.co_firstlineno + 1, outer.__code__.co_firstlineno + 1,
                                          outer.__code__.co_firstlineno + 3)
    assert [s[:2] for s in sites] == [[f"test_learned.py:{warn_line}", f"test_learned.py:{first_call}"],
                                      [f"test_learned.py:{warn_line}", f"test_learned.py:{second_call}"]]
    assert modes == ["warn", "default"]
