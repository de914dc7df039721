"""Hostile learned-matching checkpoints (`checkpoint=PATH`): a path holding anything the library
did not write is refused before any work and left as it was; a checkpoint of this run edited by
hand is validated in full, and a damaged one is discarded with a warning naming the file: the run
starts afresh and ends exactly as an uninterrupted one (never half-used)."""
import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

import lmc_fast as lf
from lmc_fast.io import save_model
from lmc_fast.match import learned_checkpoint as LC
from test_learned_checkpoint import _killed_after, _run, _same
from zoo import make_inputs, make_model


def _killed_run(monkeypatch, ckpt, **kw):
    with monkeypatch.context() as m:
        _killed_after(m, 8)  # checkpoints at steps 3 and 6; the run dies during step 9
        with pytest.raises(KeyboardInterrupt):
            _run(checkpoint=ckpt, checkpoint_every=3, **kw)


def _rewrite(ckpt, edit):
    """Unpack the saved state, let `edit` change it, pack and save it again (a valid file)."""
    with safe_open(str(ckpt), framework="pt") as f:
        meta = json.loads(f.metadata()["lmc_fast"])
        tensors = {n: f.get_tensor(n) for n in f.keys()}
    state = LC._unpack(meta["state"], tensors)
    edit(state)
    packer = LC._Packer()
    meta["state"] = packer.pack(state)
    save_file(packer.tensors, str(ckpt), metadata={"lmc_fast": json.dumps(meta, allow_nan=True)})


def _latent(state, name="residual.rotation"):
    (key,) = [k for k in state["latents"] if k.endswith(name)]
    return key


def _set_latent(change, name="residual.rotation"):
    def edit(state):
        k = _latent(state, name)
        state["latents"][k] = change(state["latents"][k])
    return edit


def _adam(field, change):
    def edit(state):
        for st in state["adam"]["state"].values():
            st[field] = change(st[field])
    return edit


def _loop(field, change):
    def edit(state):
        state["loop"][field] = change(state["loop"][field])
    return edit


def _bad_best_perm(state):
    value, step, hard = state["loop"]["best"]
    for el in hard:
        for g in el.values():
            if "perm" in g:
                g["perm"] = torch.zeros_like(g["perm"])  # not a bijection
    state["loop"]["best"] = (-1e9, step, hard)  # and a best value no later step beats


def _best_value(value):
    def edit(state):
        _, step, hard = state["loop"]["best"]
        state["loop"]["best"] = (value, step, hard)
    return edit


def _lr(state):
    for g in state["adam"]["param_groups"]:
        g["lr"] = 100.0


def _short(field):
    def edit(state):
        state[field] = state[field][:-8]
    return edit


def _zeroed(field):
    """Right dtype and length, but no state a generator can take (set_state raised RuntimeError)."""
    def edit(state):
        state[field] = torch.zeros_like(state[field])
    return edit


# (case id, edit of the unpacked state); every one is refused, the run starts afresh
DAMAGED = [
    ("best-element-not-a-bijection", _bad_best_perm),
    ("best-value-below-history", _best_value(-1e9)),
    ("best-value-not-a-number", _best_value("0.1")),
    ("latent-reshaped", _set_latent(lambda t: t[:-1])),
    ("latent-nan", _set_latent(lambda t: t.fill_(float("nan")))),
    ("latent-float64", _set_latent(lambda t: t.double())),
    ("mlp-latent-inf", _set_latent(lambda t: t.fill_(float("inf")), "blocks.mlp.perm")),
    ("adam-moment-truncated", _adam("exp_avg", lambda t: t.reshape(-1)[:-1])),
    ("adam-second-moment-negative", _adam("exp_avg_sq", lambda t: -1 - t)),
    ("adam-step-past-the-run", _adam("step", lambda t: t + 1000)),
    ("adam-lr-edited", _lr),
    ("generator-state-short", _short("generator")),
    ("torch-rng-state-short", _short("torch_rng")),
    ("generator-state-invalid", _zeroed("generator")),
    ("torch-rng-state-invalid", _zeroed("torch_rng")),
    ("step-past-the-end", _loop("step", lambda s: s + 100)),
    ("step-negative", _loop("step", lambda s: -s)),
    ("step-as-string", _loop("step", str)),
    ("batch-position-past-the-data", _loop("pos", lambda p: p + 50)),
    ("patience-spent", _loop("bad", lambda b: b + 10)),
    ("history-nan", _loop("history", lambda h: [(s, float("nan")) for s, _ in h])),
    ("scheduler-epoch-edited", lambda st: st["scheduler"].__setitem__("last_epoch", 0)),
    ("state-part-missing", lambda st: st.pop("warm")),
]


@pytest.mark.parametrize("case", DAMAGED, ids=[c[0] for c in DAMAGED])
def test_damaged_checkpoint_is_discarded_and_the_run_recomputed(tmp_path, monkeypatch, case):
    _, edit = case
    ckpt = tmp_path / "unit.learned.ckpt"
    _killed_run(monkeypatch, ckpt)
    _rewrite(ckpt, edit)
    with pytest.warns(UserWarning, match=rf"{ckpt.name}: damaged learned-matching checkpoint"):
        resumed = _run(checkpoint=ckpt, checkpoint_every=3)
    _same(resumed, _run())


# (case id, bytes of the file kept): no longer a safetensors file, so no longer recognisably one of ours
TRUNCATED = [("header-only", lambda n: 8), ("half", lambda n: n // 2), ("last-byte-missing", lambda n: n - 1)]


@pytest.mark.parametrize("case", TRUNCATED, ids=[c[0] for c in TRUNCATED])
def test_a_truncated_checkpoint_is_refused_in_one_line_naming_it(tmp_path, monkeypatch, case):
    _, keep = case
    ckpt = tmp_path / "unit.learned.ckpt"
    _killed_run(monkeypatch, ckpt)
    data = ckpt.read_bytes()
    ckpt.write_bytes(data[:keep(len(data))])
    before = ckpt.read_bytes()
    with pytest.raises(ValueError, match=rf"checkpoint .*{ckpt.name} holds something other than") as err:
        _run(checkpoint=ckpt, checkpoint_every=3)
    assert "\n" not in str(err.value) and ckpt.read_bytes() == before


def test_clean_checkpoint_rewritten_as_is_still_resumes(tmp_path, monkeypatch):
    """The validation accepts what `save` writes (the rewrite helper changes nothing by itself)."""
    ckpt = tmp_path / "unit.learned.ckpt"
    _killed_run(monkeypatch, ckpt)
    _rewrite(ckpt, lambda state: None)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _same(_run(checkpoint=ckpt, checkpoint_every=3), _run())


def _model_file(tmp_path):
    save_model(make_model("vit", seed=3, dtype=torch.float32), tmp_path / "model")
    (path,) = (tmp_path / "model").glob("*.safetensors")
    return path


def _text_file(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("my notes\n")
    return path


def _other_safetensors(tmp_path):
    path = tmp_path / "weights.safetensors"
    save_file({"w": torch.ones(3)}, str(path), metadata={"lmc_fast": json.dumps({"format": "other"})})
    return path


def _alignment_file(tmp_path):
    """The library's own file, of another kind (its lmc_fast metadata is no checkpoint's)."""
    path = tmp_path / "al.safetensors"
    a, b = make_model("vit", seed=71, dtype=torch.float32), make_model("vit", seed=72, dtype=torch.float32)
    lf.align(a, b, "weight", max_iter=2).save(path)
    return path


def _empty_file(tmp_path):
    path = tmp_path / "empty.ckpt"
    path.write_bytes(b"")
    return path


# (case id, maker of a path holding something the library did not write as a checkpoint)
NOT_OURS = [("model-file", _model_file), ("text-file", _text_file), ("other-safetensors", _other_safetensors),
            ("alignment-file", _alignment_file), ("empty-file", _empty_file)]


@pytest.mark.parametrize("case", NOT_OURS, ids=[c[0] for c in NOT_OURS])
def test_align_refuses_to_overwrite_a_file_it_did_not_write(tmp_path, monkeypatch, case):
    _, make = case
    path = make(tmp_path)
    before = path.read_bytes()
    a, b = make_model("vit", seed=71, dtype=torch.float32), make_model("vit", seed=72, dtype=torch.float32)
    data = [(make_inputs("vit", seed=s, batch=8, dtype=torch.float32),
             torch.randint(0, 5, (8,), generator=torch.Generator().manual_seed(s))) for s in range(4)]
    calls = []
    monkeypatch.setattr(lf.match.learned, "end_models_training_loss", lambda *a, **k: calls.append(1) or 1.0)
    with pytest.raises(ValueError, match=rf"{path.name} holds something other than a learned-matching checkpoint"):
        lf.align(a, b, "learned", data=data, steps=4, eval_every=2, checkpoint=path, checkpoint_every=2)
    assert path.read_bytes() == before and not calls  # refused before any work


def test_a_checkpoint_in_a_non_utf8_folder_resumes(tmp_path, monkeypatch):
    """Not refused as "something other than a learned-matching checkpoint": safetensors takes only UTF-8 names."""
    import os

    folder = os.fsdecode(os.fsencode(tmp_path) + b"/caf\xe9")
    os.mkdir(folder)
    ckpt = os.path.join(folder, "unit.learned.ckpt")
    _killed_run(monkeypatch, ckpt)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _same(_run(checkpoint=ckpt, checkpoint_every=3), _run())


def test_a_checkpoint_path_that_cannot_be_written_is_refused_before_any_work(tmp_path, monkeypatch):
    """Its folder is a file: refused now, not by the first save after `checkpoint_every` steps of work."""
    (tmp_path / "notes").write_text("a file, not a folder")
    a, b = make_model("vit", seed=71, dtype=torch.float32), make_model("vit", seed=72, dtype=torch.float32)
    data = [(make_inputs("vit", seed=s, batch=8, dtype=torch.float32),
             torch.randint(0, 5, (8,), generator=torch.Generator().manual_seed(s))) for s in range(4)]
    calls = []
    monkeypatch.setattr(lf.match.learned, "end_models_training_loss", lambda *a, **k: calls.append(1) or 1.0)
    with pytest.raises(ValueError, match=r"checkpoint .*notes is not a folder"):
        lf.align(a, b, "learned", data=data, steps=4, eval_every=2, checkpoint=tmp_path / "notes" / "c.ckpt",
                 checkpoint_every=2)
    assert not calls


def test_an_invalid_learned_element_never_leaves_as_an_alignment():
    """exact_alignment validates what it builds (it returned an Alignment failing its own validate())."""
    from lmc_fast.match.learned_module import exact_alignment
    from lmc_fast.symmetry import Alignment, canonical_spec
    from lmc_fast.models.adapters import standard_params

    arch, _ = standard_params(make_model("vit", seed=1, dtype=torch.float32))
    spec = canonical_spec(arch)
    hard = {g: dict(el) for g, el in Alignment.identity(spec).elements.items()}
    g = next(n for n, grp in spec.groups.items() if grp.kind == "permutation")
    hard[g]["perm"] = torch.zeros_like(hard[g]["perm"])
    with pytest.raises(ValueError, match="not a bijection"):
        exact_alignment(spec, hard, {})
