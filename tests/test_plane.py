"""lf.plane: the loss on the plane through three models, as one batched sweep."""
import math

import pytest
import torch

import lmc_fast as lf
from lmc_fast.models.adapters import adapter_for, standard_params
from lmc_fast.sweep.interpolate import interpolate
from lmc_fast.sweep.metrics import evaluate
from lmc_fast.sweep.plane import plane_basis, plane_weights
from zoo import make_batches, make_model


def _with_key_bias_shift(model, seed):
    """The model with its attention key biases moved: softmax ignores a per-query constant, so the
    function is unchanged (a direction the loss cannot see)."""
    arch, p = standard_params(model)
    g = torch.Generator().manual_seed(seed)
    for l in range(arch.n_layer):
        k = f"blocks.{l}.attn.k.bias"
        p[k] = p[k] + torch.randn(p[k].shape, generator=g, dtype=p[k].dtype)
    return adapter_for(model).build(model, p)


def test_a_plane_of_invisible_directions_is_flat_everywhere():
    """The planted case: three models that differ only in key biases compute one function, so every
    point of the plane through them (inside the triangle and beyond it) has the models' loss."""
    a = make_model("gpt2", seed=1)
    b, c = _with_key_bias_shift(a, 2), _with_key_bias_shift(a, 3)
    data = make_batches("gpt2")
    res = lf.plane([a, b, c], data, n=7, margin=0.5, space="raw")
    own = res["models"][0]["loss"]
    assert max(abs(v - own) for row in res["loss"] for v in row) < 1e-10
    assert len(res["x"]) == len(res["y"]) == 7 and len(res["loss"]) == 7 and len(res["loss"][0]) == 7


def test_grid_points_are_the_mixtures_they_name():
    """Each grid point equals the 3-model mixture its weights say (evaluated one at a time), the
    models sit at their coordinates, and the basis is orthonormal: |x e1 + y e2| = sqrt(x^2 + y^2)."""
    models = [make_model("vit", seed=s) for s in (1, 2, 3)]
    data = make_batches("vit")
    res = lf.plane(models, data, n=4, margin=0.25)
    basis = res["basis"]
    W = plane_weights(basis, res["x"], res["y"])
    for idx in (0, 5, 15):
        i, j = divmod(idx, 4)
        mixed = interpolate(models, W[idx].tolist())
        assert math.isclose(evaluate(mixed, data)["loss"], res["loss"][i][j], rel_tol=1e-9, abs_tol=1e-12)
    corners = [(m["x"], m["y"]) for m in res["models"]]
    torch.testing.assert_close(plane_weights(basis, [corners[1][0]], [0.0])[0],
                               torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64), atol=1e-12, rtol=0)
    torch.testing.assert_close(plane_weights(basis, [corners[2][0]], [corners[2][1]])[0],
                               torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64), atol=1e-12, rtol=0)
    for m, model in zip(res["models"], models):
        assert math.isclose(m["loss"], evaluate(lf.to_canonical(model), data)["loss"], rel_tol=1e-9)
    # orthonormal coordinates: the distance between models 1 and 2 in the plane equals |theta_2 - theta_1|
    p = [standard_params(lf.to_canonical(m))[1] for m in models]
    dist = math.sqrt(sum(float(((p[2][k] - p[1][k]) ** 2).sum()) for k in p[0]))
    assert math.isclose(math.dist(corners[1], corners[2]), dist, rel_tol=1e-9)


def test_the_loop_and_fused_engines_agree():
    models = [make_model("llama", seed=s) for s in (1, 2, 3)]
    data = make_batches("llama")
    fused = lf.plane(models, data, n=3)
    loop = lf.plane(models, data, n=3, engine="loop")
    for rf, rl in zip(fused["loss"], loop["loss"]):
        for f, l in zip(rf, rl):
            assert math.isclose(f, l, rel_tol=1e-9)


@pytest.mark.parametrize("bad, message", [
    (dict(n=1), "grid points per side"), (dict(n=True), "grid points per side"), (dict(n=500), "grid points"),
    (dict(margin=-1.0), "margin must be"), (dict(margin=float("nan")), "margin must be"),
    (dict(engine="magic"), "engine must be")])
def test_bad_arguments_are_refused_in_one_line(bad, message):
    models = [make_model("vit", seed=s) for s in (1, 2, 3)]
    with pytest.raises(ValueError, match=message) as info:
        lf.plane(models, make_batches("vit"), **bad)
    assert "\n" not in str(info.value)


def test_degenerate_planes_are_refused():
    a, b = make_model("vit", seed=1), make_model("vit", seed=2)
    with pytest.raises(ValueError, match="exactly three models"):
        lf.plane([a, b], make_batches("vit"))
    with pytest.raises(ValueError, match="the same point"):
        lf.plane([a, a, b], make_batches("vit"))
    pa, pb = standard_params(a)[1], standard_params(b)[1]
    mid = adapter_for(a).build(a, {k: 0.3 * pa[k] + 0.7 * pb[k] for k in pa})
    with pytest.raises(ValueError, match="lies on the line"):
        lf.plane([a, b, mid], make_batches("vit"), space="raw")
    assert plane_basis([standard_params(m)[1] for m in (a, b, make_model("vit", seed=3))])["norm_v"] > 0


def test_the_aligned_path_of_a_planted_pair_is_flat():
    """A planted pair: B = g . A', where A' is A with its key biases moved (the same function, another
    point) and g a random permutation of the raw group. Permutation matching recovers g, so on the plane
    through A, B aligned and an independent C the path A -> B aligned (the x axis) is flat; through A, B
    and C raw it is not."""
    from lmc_fast.symmetry import Alignment, permutation_spec

    a = make_model("gpt2", seed=1)
    arch, _ = standard_params(a)
    b = Alignment.random(permutation_spec(arch), seed=4).apply(_with_key_bias_shift(a, 2))
    c = make_model("gpt2", seed=5)
    al = lf.align(a, b, "permutation")
    data = make_batches("gpt2")
    aligned = lf.plane([a, al.apply(b), c], data, n=9, margin=0.0, space="raw")
    raw = lf.plane([a, b, c], data, n=9, margin=0.0, space="raw")
    own = aligned["models"][0]["loss"]
    for plane, flat in ((aligned, True), (raw, False)):
        assert plane["y"][0] == 0.0
        end = plane["models"][1]["x"]
        on_path = [v for x, v in zip(plane["x"], plane["loss"][0]) if 0.0 <= x <= end]
        assert len(on_path) >= 5
        bump = max(abs(v - own) for v in on_path)
        assert (bump < 1e-9) if flat else (bump > 1e-3), bump
