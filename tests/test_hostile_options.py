"""Hostile options: every option of `lf.align` (and of a grid's [methods.NAME] tables, at parse
time) is checked by its one rule before any work starts, and refused in one line naming it;
none is accepted to run nothing (steps=-3, max_iter=-5) or to fail deep inside (eval_every=0,
val_fraction=1.0)."""
import pytest
import torch

import lmc_fast as lf
import lmc_fast.grid as grid
from lmc_fast.grid.spec import parse_spec
from lmc_fast.match import learned, weight
from zoo import make_inputs, make_model


def _data(n=4):
    return [(make_inputs("vit", seed=s, batch=8, dtype=torch.float32),
             torch.randint(0, 5, (8,), generator=torch.Generator().manual_seed(s))) for s in range(n)]


# (case id, method, option, bad value, text of the one line)
BAD = [
    ("max-iter-negative", "weight", "max_iter", -5, "max_iter must be a whole number"),
    ("max-iter-fraction", "weight", "max_iter", 2.5, "max_iter must be a whole number"),
    ("tol-nan", "weight", "tol", float("nan"), "tol must be a finite number"),
    ("seed-negative", "weight", "seed", -1, "seed must be a whole number"),
    ("token-counts-a-number", "weight", "token_counts", 5, "token_counts must be a vocab-length counts vector"),
    ("permutation-max-iter-zero", "permutation", "max_iter", 0, "max_iter must be a whole number"),
    ("activation-max-batches-zero", "activation", "max_batches", 0, "max_batches must be a whole number"),
    ("steps-negative", "learned", "steps", -3, "steps must be a whole number"),
    ("steps-bool", "learned", "steps", True, "steps must be a whole number"),
    ("eval-every-zero", "learned", "eval_every", 0, "eval_every must be a whole number"),
    ("patience-zero", "learned", "patience", 0, "patience must be a whole number"),
    ("lambdas-per-step-zero", "learned", "lambdas_per_step", 0, "lambdas_per_step must be a whole number"),
    ("val-fraction-one", "learned", "val_fraction", 1.0, "val_fraction must be a finite number"),
    ("val-fraction-zero", "learned", "val_fraction", 0.0, "val_fraction must be a finite number"),
    ("lr-negative", "learned", "lr", -1.0, "lr must be a finite number"),
    ("lr-nan", "learned", "lr", float("nan"), "lr must be a finite number"),
    ("temperature-zero", "learned", "temperature", 0.0, "temperature must be a finite number"),
    ("lam-outside-the-segment", "learned", "lam", 1.5, "lam must be one of"),
    ("checkpoint-every-zero", "learned", "checkpoint_every", 0, "checkpoint_every must be a whole number"),
]


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_align_refuses_a_bad_option_before_any_work(monkeypatch, tmp_path, case):
    _, method, option, value, text = case
    calls = []
    for module, name in ((weight, "weight_matching"), (learned, "end_models_training_loss"),
                         (learned, "fit_alignments")):
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, _real=real, **k: calls.append(1) or _real(*a, **k))
    a, b = make_model("vit", seed=71, dtype=torch.float32), make_model("vit", seed=72, dtype=torch.float32)
    kw = {option: value}
    if option == "checkpoint_every":
        kw["checkpoint"] = tmp_path / "c.ckpt"
    with pytest.raises(ValueError, match=text):
        lf.align(a, b, method, data=_data() if method in ("activation", "learned") else None, **kw)
    assert not calls  # nothing ran


def _mixup():
    from lmc_fast.data.augment import Mixup

    return Mixup(1.0)


# (case id, lf.align keywords of "learned", text of the one line): refused before the preset's evaluation
# of the end models and the initial weight matching, not after them
LEARNED_BAD = [
    ("mixup-with-target-labels", lambda: dict(target="labels", augment=_mixup()), "changes what the labels describe"),
    ("mixup-with-the-paper-preset", lambda: dict(preset="paper", augment=_mixup()), "changes what the labels describe"),
    ("augment-unknown-name", lambda: dict(augment="mixup"), "augment must be 'auto', 'none', None or"),
]


@pytest.mark.parametrize("case", LEARNED_BAD, ids=[c[0] for c in LEARNED_BAD])
def test_learned_refuses_options_that_contradict_before_any_work(monkeypatch, case):
    _, kw, text = case
    calls = []
    for module, name in ((weight, "align_by_weights"), (learned, "end_models_training_loss"),
                         (learned, "fit_alignments")):
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, _real=real, **k: calls.append(name) or _real(*a, **k))
    a, b = make_model("vit", seed=71, dtype=torch.float32), make_model("vit", seed=72, dtype=torch.float32)
    with pytest.raises(ValueError, match=text):
        lf.align(a, b, "learned", data=_data(), steps=2, **kw())
    assert not calls  # nothing ran


def test_mixup_with_a_preset_that_distills_is_taken():
    a, b = make_model("vit", seed=71, dtype=torch.float32), make_model("vit", seed=72, dtype=torch.float32)
    al = lf.align(a, b, "learned", data=_data(), steps=2, eval_every=1, preset="distill", augment=_mixup())
    assert al.info["steps"] == 2


def test_a_validation_fraction_leaves_a_training_batch():
    """val_fraction 0.9 of 2 batches rounds to both: one stays for training (it raised StopIteration)."""
    a, b = make_model("vit", seed=71, dtype=torch.float32), make_model("vit", seed=72, dtype=torch.float32)
    al = lf.align(a, b, "learned", data=_data(2), steps=2, eval_every=1, val_fraction=0.9)
    assert al.info["steps"] == 2


def _grid_spec(options, methods=("none", "learned"), table="learned"):
    return {"data": {"spec": "digits", "max_batches": 2, "batch_size": 8},
            "models": {"paths": ["/nonexistent/a", "/nonexistent/b"]},
            "grid": {"pairs": "all", "methods": list(methods), "lambdas": 3}, "methods": {table: options}}


# every method's cases (checkpoint_every is no grid option); a TOML value is never a counts vector
GRID_BAD = [c for c in BAD if c[2] != "checkpoint_every"] + [
    ("token-counts-a-string", "weight", "token_counts", "train", "token_counts must be a vocab-length counts vector"),
]


@pytest.mark.parametrize("case", GRID_BAD, ids=[c[0] for c in GRID_BAD])
def test_grid_spec_refuses_a_bad_method_option_at_parse_time(case):
    _, method, option, value, text = case
    with pytest.raises(ValueError, match=f"methods.{method}.{option}"):
        parse_spec(_grid_spec({option: value}, ("none", method), method))


def _vit_paths(folder):
    from lmc_fast.io import save_model
    from lmc_fast.models import ViT, ViTConfig

    paths = []
    for seed in range(2):
        torch.manual_seed(seed)
        save_model(ViT(ViTConfig.digits(d_model=16, n_layer=1, n_head=2, d_mlp=32)), folder / f"m{seed}")
        paths.append(str(folder / f"m{seed}"))
    return paths


# (case id, the column, its [methods.NAME] table, text of the one line): "none" comes first in every grid,
# so a check made when the column's unit runs would come after a finished unit
GRID_RUN_BAD = [
    ("learned-steps-negative", "learned", {"steps": -3}, "methods.learned.steps"),
    ("weight-max-iter-negative", "weight", {"max_iter": -1}, "methods.weight.max_iter"),
    ("weight-unknown-option", "weight", {"steps": 3}, "methods.weight.steps: unknown option"),
    ("weight-token-counts", "weight", {"token_counts": 5}, "methods.weight.token_counts must be"),
    ("permutation-heads-not-a-bool", "permutation", {"heads": 1}, "methods.permutation.heads must be True or False"),
    ("variant-max-iter-zero", "w0", {"method": "weight", "max_iter": 0}, "methods.w0.max_iter"),
]


@pytest.mark.parametrize("case", GRID_RUN_BAD, ids=[c[0] for c in GRID_RUN_BAD])
def test_grid_refuses_a_bad_option_before_any_unit(tmp_path, case):
    _, column, options, text = case
    spec = _grid_spec(options, ("none", column), column)
    spec["models"]["paths"] = _vit_paths(tmp_path)
    with pytest.raises(ValueError, match=text):
        grid.run(spec, tmp_path / "out", quiet=True)
    assert not (tmp_path / "out" / "units").exists()


def test_weighting_sqrt_is_an_option_of_lf_align():
    """Documented (lf.align, README) and taken by the solver, but refused by the options' check."""
    a, b = make_model("vit", seed=71, dtype=torch.float32), make_model("vit", seed=72, dtype=torch.float32)
    assert lf.align(a, b, "weight", weighting="sqrt", max_iter=2).info["weighting"] == "sqrt"
    assert parse_spec(_grid_spec({"weighting": "sqrt"}, ("none", "weight"), "weight")).options == {
        "weight": {"weighting": "sqrt"}}


def _sized_spec(seeds=3, pairs="all", methods=("none",), paths=None, simplex=None):
    models = {"paths": [f"m{i}" for i in range(paths)]} if paths else {"recipe": "vit-digits", "seeds": list(range(seeds))}
    spec = {"data": {"spec": "digits"}, "models": models, "grid": {"pairs": pairs, "methods": list(methods)}}
    if simplex is not None:
        spec["simplex"] = simplex
    return spec


# (case id, spec, the one line's text): each refused before its pairs, units or groups are built
TOO_BIG = [
    ("2000-seeds-all-pairs", _sized_spec(2000), 'grid.pairs: "all" of 2000 models makes 1999000 pairs, more than 100000'),
    ("60000-seeds", _sized_spec(60000), "models.seeds: 60000 seeds, more than 10000 (every model is trained"),
    ("60000-seeds-consecutive", _sized_spec(60000, "consecutive"), "models.seeds: 60000 seeds, more than 10000"),
    ("60000-paths", _sized_spec(paths=60000, pairs="consecutive"), "models.paths: 60000 checkpoints, more than 10000"),
    ("200000-listed-pairs", _sized_spec(1000, [[0, 1]] * 200_000), "grid.pairs: 200000 pairs listed, more than 100000"),
    ("pairs-times-methods", _sized_spec(9000, "consecutive", ("none", *(f"w{k}" for k in range(12))))
     | {"methods": {f"w{k}": {"method": "weight"} for k in range(12)}},
     "grid: 8999 pairs x 13 methods make 116987 units, more than 100000 (each is a sweep and a file in units/"),
    ("listed-pairs-times-methods", _sized_spec(1000, [[i, i + 1] for i in range(999)] * 60, ("none", "weight")),
     "grid: 59940 pairs x 2 methods make 119880 units, more than 100000"),
    ("simplex-group-of-1000", _sized_spec(1000, "consecutive", simplex={"groups": [list(range(1000))]}),
     "simplex.groups: a group of 1000 models, more than 256"),
    ("simplex-group-of-a-million", _sized_spec(3, simplex={"groups": [[0, 1, 2] + [0] * 10**6]}),
     "simplex.groups: a group of 1000003 models, more than 256"),
    ("200001-simplex-groups", _sized_spec(3, simplex={"groups": [[0, 1]] * 200_001}),
     "simplex.groups: 200001 groups, more than 100000"),
    ("simplex-groups-times-methods", _sized_spec(3, simplex={"groups": [[0, 1], [1, 0]] * 30_000,
                                                             "methods": ["none", "weight"]}),
     "grid: 3 pairs x 1 methods + 60000 simplex groups x 2 methods make 120003 units, more than 100000"),
]


@pytest.mark.parametrize("case", TOO_BIG, ids=[c[0] for c in TOO_BIG])
def test_grid_spec_counts_its_size_before_building_it(case):
    import time

    _, spec, message = case
    t0 = time.perf_counter()
    with pytest.raises(ValueError) as info:
        parse_spec(spec)
    assert message in str(info.value) and "\n" not in str(info.value)
    assert time.perf_counter() - t0 < 1.0  # nothing built pair by pair


def test_the_largest_grid_spec_is_taken():
    spec = parse_spec(_sized_spec(10_000, "consecutive", ("none", "weight")))
    assert len(spec.pairs) == 9999 and len(spec.seeds) == 10_000


def test_a_spec_file_larger_than_a_spec_is_refused_before_reading(tmp_path):
    from lmc_fast.grid.spec import MAX_SPEC_BYTES, load_spec

    path = tmp_path / "grid.toml"
    with open(path, "wb") as f:
        f.truncate(MAX_SPEC_BYTES + 1)  # sparse: no disk used
    with pytest.raises(ValueError, match=r"grid.toml: 16777217 bytes, more than a grid spec's 16 MiB"):
        load_spec(path)


# (case id, merge_many keywords, text of the one line)
MERGE_BAD = [
    ("rounds-negative", dict(rounds=-3), "rounds must be a whole number"),
    ("rounds-fraction", dict(rounds=2.5), "rounds must be a whole number"),
    ("mean-with-a-data-method", dict(method="activation", data=_data(2), mode="mean"), "needs a data-free method"),
]


@pytest.mark.parametrize("case", MERGE_BAD, ids=[c[0] for c in MERGE_BAD])
def test_merge_many_refuses_a_bad_option_before_any_alignment(monkeypatch, case):
    from lmc_fast.match import many

    _, kw, text = case
    calls = []
    monkeypatch.setattr(many, "align", lambda *a, **k: calls.append(1))
    models = [make_model("vit", seed=s, dtype=torch.float32) for s in range(3)]
    with pytest.raises(ValueError, match=text):
        lf.merge_many(models, **kw)
    assert not calls


# (case id, sweep function, keywords, text of the one line)
SWEEP_BAD = [
    ("barrier-chunk-fraction", "barrier", dict(chunk=2.5), "chunk must be a whole number"),
    ("barrier-max-batches-fraction", "barrier", dict(max_batches=1.5), "max_batches must be a whole number"),
    ("barrier-max-batches-zero", "barrier", dict(max_batches=0), "max_batches must be a whole number"),
    ("barrier-checkpoint-every-fraction", "barrier", dict(checkpoint_every=0.5, checkpoint="x"),
     "checkpoint_every must be a whole number"),
    ("simplex-seed-fraction", "simplex", dict(seed=1.5), "seed must be a whole number"),
    ("simplex-chunk-bool", "simplex", dict(chunk=True), "chunk must be a whole number"),
]


@pytest.mark.parametrize("case", SWEEP_BAD, ids=[c[0] for c in SWEEP_BAD])
def test_sweeps_refuse_a_bad_count(tmp_path, monkeypatch, case):
    _, fn, kw, text = case
    monkeypatch.chdir(tmp_path)
    a, b = make_model("vit", seed=1), make_model("vit", seed=2)
    data = [(make_inputs("vit", seed=1, batch=4), torch.zeros(4, dtype=torch.long))]
    with pytest.raises(ValueError, match=text):
        if fn == "barrier":
            lf.barrier(a, b, data, 3, **kw)
        else:
            lf.simplex([a, b], data, n=2, **kw)
    assert not list(tmp_path.iterdir())


def test_label_changing_augmentations_agree_with_their_classes():
    """data_specs.LABEL_CHANGING (torch-free, read by the grid and the CLI) names exactly the augmentations
    whose class says its blends change what the labels describe."""
    from lmc_fast.data_specs import AUGMENTATIONS, LABEL_CHANGING, augmentation

    changing = {name for name, kind in AUGMENTATIONS.items() if isinstance(kind, tuple)
                and not getattr(augmentation(name), "label_preserving", True)}
    assert changing == set(LABEL_CHANGING)


def test_grid_refuses_mixup_with_label_targets_at_parse_time():
    with pytest.raises(ValueError, match="methods.learned.augment='mixup' changes what the labels describe"):
        parse_spec(_grid_spec({"augment": "mixup", "target": "labels"}, ("none", "learned"), "learned"))
    parse_spec(_grid_spec({"augment": "mixup", "target": "endpoints"}, ("none", "learned"), "learned"))


def test_cli_align_refuses_mixup_with_label_targets_before_loading(tmp_path, capsys):
    from lmc_fast.cli import main

    missing = str(tmp_path / "nothing-here")  # never read: the refusal comes first
    code = main(["align", missing, missing, "--method", "learned", "--augment", "mixup", "--target", "labels",
                 "--out", str(tmp_path / "w.safetensors")])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "changes what the labels describe" in err
