"""The default block size of a language model's text is min(64, its context), whatever its config
calls the context: a Hugging Face Llama or Mistral with max_position_embeddings 32 was refused
("sequence length 64 exceeds the model's context of 32 positions") without --block-size, and a grid
of such models (ours with block_size 32 too) failed so at its first unit. One rule for the commands
and the grid (data_specs.block_size_for): the given block, else the one the first model was trained
on, else min(64, every model's context); a longer block is refused in one line before any work."""
import json

import pytest
import torch

import lmc_fast.grid as grid
from lmc_fast.cli import main
from lmc_fast.io import save_model


def _llama(cls_name, config_name, **extra):
    def make(seed):
        import transformers

        torch.manual_seed(seed)
        config = getattr(transformers, config_name)(vocab_size=256, hidden_size=16, intermediate_size=32,
                                                    num_hidden_layers=1, num_attention_heads=2,
                                                    num_key_value_heads=2, max_position_embeddings=32, **extra)
        return getattr(transformers, cls_name)(config)
    return make


def _hf_gpt2(seed):
    import transformers

    torch.manual_seed(seed)
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=256,
                                                                n_positions=32, bos_token_id=0, eos_token_id=0))


def _ours(name):
    def make(seed):
        from lmc_fast import models

        torch.manual_seed(seed)
        config = {"Llama": dict(n_layer=1, d_model=16, n_head=2, n_kv_head=1), "GPT2": dict(n_layer=1, n_embd=16, n_head=2),
                  "NeoX": dict(n_layer=1, d_model=16, n_head=2)}[name]
        return getattr(models, name)(getattr(models, name + "Config")(vocab_size=256, block_size=32, **config))
    return make


# (case id, maker of a model whose context is 32 positions)
MODELS = [("hf-llama", _llama("LlamaForCausalLM", "LlamaConfig")),
          ("hf-mistral", _llama("MistralForCausalLM", "MistralConfig", sliding_window=None)),
          ("hf-gpt2", _hf_gpt2), ("ours-llama", _ours("Llama")), ("ours-gpt2", _ours("GPT2")),
          ("ours-neox", _ours("NeoX"))]


def _write(make, folder, n=2, metadata=None):
    paths = []
    for s in range(n):
        model = make(s)
        if hasattr(model, "save_pretrained"):
            model.save_pretrained(folder / f"m{s}")
        else:
            save_model(model, folder / f"m{s}", metadata=metadata)
        paths.append(str(folder / f"m{s}"))
    return paths


def _text(tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("the quick brown fox jumps over the lazy dog.\n" * 40)
    return f"text:{text}"


@pytest.mark.parametrize("case", MODELS, ids=[c[0] for c in MODELS])
def test_sweep_takes_the_context_as_the_default_block_size(tmp_path, case):
    _, make = case
    paths = _write(make, tmp_path)
    out = tmp_path / "s.json"
    rc = main(["sweep", *paths, "--data", _text(tmp_path), "--out", str(out), "--lambdas", "3", "-q"])
    assert rc == 0
    assert len(json.loads(out.read_text())["results"]["none"]["lambdas"]) == 3


# (case id, command line after `lmc-fast` reading text for models {a} {b}; {d} the data, {o} an output folder)
COMMANDS = [("align-activation", ["align", "{a}", "{b}", "--method", "activation", "--in-memory", "--data", "{d}",
                                  "--max-batches", "2", "--out", "{o}/al.safetensors"]),
            ("align-activation-streamed", ["align", "{a}", "{b}", "--method", "activation", "--data", "{d}",
                                           "--max-batches", "2", "--out", "{o}/al.safetensors"]),
            ("merge", ["merge", "{a}", "{b}", "--data", "{d}", "--eval-batches", "1", "--samples", "2", "--out", "{o}/m"]),
            ("plane", ["plane", "{a}", "{b}", "--data", "{d}", "--n", "3", "--max-batches", "1", "--out", "{o}/p.json"])]


@pytest.mark.parametrize("command", COMMANDS, ids=[c[0] for c in COMMANDS])
@pytest.mark.parametrize("case", MODELS[::3], ids=[c[0] for c in MODELS[::3]])
def test_every_command_reading_text_takes_the_context(tmp_path, capsys, case, command):
    paths = _write(case[1], tmp_path)
    argv = [a.format(a=paths[0], b=paths[1], d=_text(tmp_path), o=tmp_path / "out") for a in command[1]]
    assert main(argv + ["-q"]) == 0, capsys.readouterr().err


@pytest.mark.parametrize("case", MODELS[::3], ids=[c[0] for c in MODELS[::3]])
def test_a_block_longer_than_the_context_is_refused_in_one_line(tmp_path, capsys, case):
    paths = _write(case[1], tmp_path)
    capsys.readouterr()  # transformers' own progress bar while saving
    rc = main(["sweep", *paths, "--data", _text(tmp_path), "--block-size", "64", "--out", str(tmp_path / "s.json"), "-q"])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert "--block-size 64: longer than the context of" in err and "(32 positions)" in err
    assert not (tmp_path / "s.json").exists()


def _grid_spec(paths, data, **extra):
    return {"data": {"spec": data, "max_batches": 1, "batch_size": 2, **extra}, "models": {"paths": paths},
            "grid": {"pairs": "all", "methods": ["none", "weight"], "lambdas": 3}, "methods": {}}


@pytest.mark.parametrize("case", MODELS, ids=[c[0] for c in MODELS])
def test_a_grid_takes_the_context_as_the_default_block_size(tmp_path, case):
    """The grid follows the same rule: its numbers are those of data.block_size = 32 (the same units:
    a run that gives 32 reuses every one)."""
    paths = _write(case[1], tmp_path)
    data = _text(tmp_path)
    first = grid.run(_grid_spec(paths, data), tmp_path / "g", quiet=True)
    assert first["computed"] == 2
    again = grid.run(_grid_spec(paths, data, block_size=32), tmp_path / "g", quiet=True)
    assert again["reused"] == 2 and [r["barrier"] for r in again["records"]] == [r["barrier"] for r in first["records"]]


@pytest.mark.parametrize("case", MODELS[::3], ids=[c[0] for c in MODELS[::3]])
def test_a_grid_block_longer_than_the_context_is_refused_before_any_unit(tmp_path, case):
    paths = _write(case[1], tmp_path)
    with pytest.raises(ValueError, match=r"data.block_size 64: longer than the context of .*m0 \(32 positions\)") as info:
        grid.run(_grid_spec(paths, _text(tmp_path), block_size=64), tmp_path / "g", quiet=True)
    assert "\n" not in str(info.value) and not (tmp_path / "g" / "units").exists()


def test_a_grid_reads_the_block_its_models_were_trained_on(tmp_path):
    """A checkpoint that records its training block (lmc-fast train --block-size 16) is swept in blocks of
    16, as `lmc-fast sweep` does, not 64."""
    paths = _write(_ours("GPT2"), tmp_path, metadata={"block_size": 16})
    data = _text(tmp_path)
    first = grid.run(_grid_spec(paths, data), tmp_path / "g", quiet=True)
    assert grid.run(_grid_spec(paths, data, block_size=16), tmp_path / "g", quiet=True)["reused"] == first["computed"]
    out = tmp_path / "s.json"
    assert main(["sweep", *paths, "--data", data, "--lambdas", "3", "--max-batches", "1", "--batch-size", "2",
                 "--out", str(out), "-q"]) == 0
    swept = json.loads(out.read_text())["results"]["none"]
    assert swept["loss"] == first["records"][0]["curve"]["loss"]
