"""Checkpoint I/O: round trips (reference and Hugging Face models, tied and untied GPT-2) keep
the function; damaged checkpoints fail with a ValueError naming the file or parameter; writes
are atomic."""
import json
import os

import pytest
import torch

import lmc_fast as lf
from lmc_fast.io import CheckpointError, CheckpointNotFoundError, load_model, read_header, save_model
from lmc_fast.models.adapters import UnsupportedModelError
from zoo import logits, make_inputs, make_model


def _tied(m):
    if isinstance(m, lf.models.GPT2):
        return m.lm_head.weight is m.tok_embed.weight
    return m.lm_head.weight is m.transformer.wte.weight


def _same_function(m1, m2, kind):
    x = make_inputs(kind)
    with torch.no_grad():
        torch.testing.assert_close(logits(m1.eval(), x), logits(m2.eval(), x), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kind", ["vit", "gpt2", "hf_gpt2", "hf_vit"])
@pytest.mark.parametrize("canonical", [False, True], ids=["raw", "canonical"])
def test_round_trip_folder(tmp_path, kind, canonical):
    m = make_model(kind)
    if canonical:  # GPT-2 in canonical form is untied
        m = lf.to_canonical(m)
    save_model(m, tmp_path / "ckpt", metadata={"seed": 3, "data": "digits"})
    m2 = load_model(tmp_path / "ckpt")
    assert type(m2) is type(m)
    assert next(m2.parameters()).dtype == torch.float64
    assert m2.lmc_fast_metadata == {"seed": 3, "data": "digits"}
    _same_function(m, m2, kind)
    if "gpt2" in kind:
        assert _tied(m2) == _tied(m) == (not canonical)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary leftovers


def test_single_file_with_sibling_json_and_alone(tmp_path):
    m = make_model("gpt2")
    path = save_model(m, tmp_path / "g.safetensors")
    side = tmp_path / "g.json"
    assert path.is_file() and side.is_file()
    assert json.loads(side.read_text())["model_type"] == "gpt2"
    _same_function(m, load_model(path), "gpt2")
    side.unlink()  # the safetensors header alone describes the model
    m2 = load_model(path)
    assert _tied(m2)
    _same_function(m, m2, "gpt2")
    assert read_header(path)["config"]["n_embd"] == 32


def test_missing_path(tmp_path):
    with pytest.raises(CheckpointNotFoundError, match="nope"):
        load_model(tmp_path / "nope")
    assert issubclass(CheckpointNotFoundError, ValueError) and issubclass(CheckpointNotFoundError, FileNotFoundError)


@pytest.mark.parametrize("kind", ["vit", "hf_gpt2"])
def test_corrupt_safetensors(tmp_path, kind):
    save_model(make_model(kind), tmp_path / "c")
    (tmp_path / "c" / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
    with pytest.raises(CheckpointError, match="model.safetensors"):
        load_model(tmp_path / "c")


def test_truncated_safetensors(tmp_path):
    save_model(make_model("vit"), tmp_path / "c")
    f = tmp_path / "c" / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-100])
    with pytest.raises(CheckpointError, match="corrupt"):
        load_model(tmp_path / "c")


def test_wrong_shapes_and_keys(tmp_path):
    save_model(make_model("vit"), tmp_path / "c")
    cfg_path = tmp_path / "c" / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["config"]["d_mlp"] = 64
    cfg_path.write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"blocks\.0\.mlp\.fc1\.(weight|bias).*shape"):
        load_model(tmp_path / "c")
    cfg["config"]["d_mlp"] = 48
    cfg["config"]["n_layer"] = 3
    cfg_path.write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"missing parameter 'blocks\.2\."):
        load_model(tmp_path / "c")
    cfg["config"]["n_layer"] = 2
    cfg["config"]["bogus"] = 1
    cfg_path.write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="bogus"):
        load_model(tmp_path / "c")
    cfg_path.write_text("{ broken")
    with pytest.raises(CheckpointError, match="config.json"):
        load_model(tmp_path / "c")


def test_nan_weights_rejected(tmp_path):
    m = make_model("vit")
    with torch.no_grad():
        m.head.weight[0, 0] = float("nan")
    save_model(m, tmp_path / "c")
    with pytest.raises(CheckpointError, match="head.weight"):
        load_model(tmp_path / "c")


def test_hf_errors(tmp_path):
    save_model(make_model("hf_gpt2"), tmp_path / "h")
    (tmp_path / "h" / "model.safetensors").unlink()
    with pytest.raises(CheckpointNotFoundError, match="model.safetensors"):
        load_model(tmp_path / "h")
    (tmp_path / "bert").mkdir()
    (tmp_path / "bert" / "config.json").write_text(json.dumps({"model_type": "t5"}))
    with pytest.raises(UnsupportedModelError, match="t5"):
        load_model(tmp_path / "bert")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="config.json"):
        load_model(tmp_path / "empty")


def test_atomic_write_leaves_nothing_on_error(tmp_path, monkeypatch):
    import safetensors.torch

    m = make_model("vit")
    save_model(m, tmp_path / "keep")
    before = (tmp_path / "keep" / "model.safetensors").read_bytes()

    def boom(*a, **k):
        raise RuntimeError("disk full")

    monkeypatch.setattr(safetensors.torch, "save_file", boom)
    for target in ("new", "keep", "file.safetensors"):
        with pytest.raises(RuntimeError):
            save_model(make_model("vit", seed=1), tmp_path / target)
    assert sorted(os.listdir(tmp_path)) == ["keep"]
    assert (tmp_path / "keep" / "model.safetensors").read_bytes() == before


def test_hf_merge_written_back_with_save_pretrained(tmp_path):
    import transformers

    ms = [make_model("hf_gpt2", seed=s, dtype=torch.float32) for s in range(2)]
    al = lf.align(ms[0], ms[1], "weight")
    mid = lf.interpolate([ms[0], al.apply(ms[1])], [0.5, 0.5])
    save_model(mid, tmp_path / "merged")
    assert (tmp_path / "merged" / "model.safetensors").is_file()
    again = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "merged", local_files_only=True)
    _same_function(mid, again, "hf_gpt2")
    assert not again.config.tie_word_embeddings
