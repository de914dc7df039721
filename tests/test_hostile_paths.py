"""Checkpoints in folders whose names are not UTF-8 (valid bytes on Linux) load like any other: one
was called "corrupt or unreadable" because safetensors takes only UTF-8 file names."""
import os

import pytest
import torch

from lmc_fast.cli import main
from lmc_fast.io import load_model, save_model
from lmc_fast.models import ViT, ViTConfig
from lmc_fast.paths import utf8_name

# (case id, folder name as bytes)
NAMES = [("latin-1", b"caf\xe9"), ("lone-continuation-byte", b"run\x80s"), ("utf-8", "café".encode())]


def _vit(seed):
    torch.manual_seed(seed)
    return ViT(ViTConfig.digits(d_model=16, n_layer=1, n_head=2, d_mlp=32))


@pytest.mark.parametrize("case", NAMES, ids=[c[0] for c in NAMES])
def test_a_checkpoint_in_a_non_utf8_folder_loads(tmp_path, case):
    _, raw = case
    folder = os.fsencode(tmp_path) + b"/" + raw
    path = os.fsdecode(folder + b"/seed0")
    model = _vit(0)
    save_model(model, path)
    back = load_model(path)
    for (k, v), (k2, v2) in zip(model.state_dict().items(), back.state_dict().items()):
        assert k == k2 and torch.equal(v, v2)


@pytest.mark.parametrize("case", NAMES[:2], ids=[c[0] for c in NAMES[:2]])
def test_the_cli_reads_checkpoints_from_a_non_utf8_folder(tmp_path, capsys, case):
    _, raw = case
    folder = os.fsdecode(os.fsencode(tmp_path) + b"/" + raw)
    for s in range(2):
        save_model(_vit(s), os.path.join(folder, f"seed{s}"))
    rc = main(["align", os.path.join(folder, "seed0"), os.path.join(folder, "seed1"), "--out",
               str(tmp_path / "al.safetensors"), "-q"])
    assert rc == 0, capsys.readouterr().err
    assert (tmp_path / "al.safetensors").is_file()


def test_utf8_name_hands_over_the_same_file(tmp_path):
    path = os.fsdecode(os.fsencode(tmp_path) + b"/x\xff.bin")
    with open(path, "wb") as f:
        f.write(b"payload")
    with utf8_name(path) as name:
        name.encode("utf-8")
        with open(name, "rb") as f:
            assert f.read() == b"payload"
    with utf8_name(tmp_path / "plain.bin") as name:
        assert name == str(tmp_path / "plain.bin")


# ---------------------------------------------------------------- every kind of checkpoint, every reader
BAD = os.fsdecode(b"ckpt-\xff")  # the folder name of the issue: one byte that is no UTF-8


def _hf_gpt2(seed):
    import transformers

    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=256, n_positions=32, bos_token_id=0,
                                  eos_token_id=0)
    return transformers.GPT2LMHeadModel(cfg)


def _save_hf(model, path):
    model.save_pretrained(path)  # transformers' own writer (a user's folder), not lmc_fast's


# (case id, model maker, writer, name in the folder)
KINDS = [("ours-folder", _vit, save_model, "seed{s}"), ("ours-file", _vit, save_model, "seed{s}.safetensors"),
         ("hf-folder", _hf_gpt2, _save_hf, "hf{s}")]


def _checkpoints(tmp_path, kind):
    _, make, write, name = kind
    folder = tmp_path / BAD
    paths = [str(folder / name.format(s=s)) for s in range(2)]
    models = [make(s) for s in range(2)]
    folder.mkdir()
    for m, p in zip(models, paths):
        write(m, p)
    return models, paths


@pytest.mark.parametrize("kind", KINDS, ids=[k[0] for k in KINDS])
def test_every_kind_of_checkpoint_in_the_folder_loads(tmp_path, kind):
    models, paths = _checkpoints(tmp_path, kind)
    for model, path in zip(models, paths):
        back = load_model(path)
        assert back.state_dict().keys() == model.state_dict().keys()
        assert all(torch.equal(v, back.state_dict()[k]) for k, v in model.state_dict().items())


# (case id, command line after `lmc-fast`: {a}, {b} the checkpoints, {o} the folder of the outputs)
COMMANDS = [("align", ["align", "{a}", "{b}", "--out", "{o}/al.safetensors"]),
            ("align-in-memory", ["align", "{a}", "{b}", "--in-memory", "--out", "{o}/al.safetensors"]),
            ("align-permutation", ["align", "{a}", "{b}", "--method", "permutation", "--out", "{o}/al.safetensors"]),
            ("merge", ["merge", "{a}", "{b}", "--out", "{o}/m"]),
            ("merge-stream", ["merge", "{a}", "{b}", "--stream", "--mode", "reference", "--out", "{o}/m"])]


@pytest.mark.parametrize("command", COMMANDS, ids=[c[0] for c in COMMANDS])
@pytest.mark.parametrize("kind", KINDS, ids=[k[0] for k in KINDS])
def test_the_cli_reads_and_writes_in_the_folder(tmp_path, capsys, kind, command):
    """Inputs and outputs in the non-UTF-8 folder; what it writes loads back."""
    from lmc_fast.symmetry import Alignment

    _, paths = _checkpoints(tmp_path, kind)
    out = tmp_path / BAD / "out"
    rc = main([a.format(a=paths[0], b=paths[1], o=out) for a in command[1]] + ["-q"])
    printed = capsys.readouterr()
    assert rc == 0, printed.err
    assert "ckpt-\\xff" in printed.out  # the written path, its byte escaped (a strict UTF-8 stdout refused it)
    if command[0].startswith("align"):
        Alignment.load(out / "al.safetensors").verify_models(load_model(paths[0]), load_model(paths[1]))
    else:
        assert load_model(out / "m" / "merged").state_dict().keys() == load_model(paths[0]).state_dict().keys()


def test_a_sweep_of_checkpoints_in_the_folder(tmp_path, capsys):
    _, paths = _checkpoints(tmp_path, KINDS[0])
    out = tmp_path / BAD
    assert main(["align", *paths, "--out", str(out / "al.safetensors"), "-q"]) == 0
    assert main(["sweep", *paths, "--align", str(out / "al.safetensors"), "--data", "digits", "--lambdas", "3",
                 "--max-batches", "1", "--out", str(out / "s.json"), "--plot", str(out / "s.png"), "-q"]) == 0, \
        capsys.readouterr().err
    assert (out / "s.json").is_file() and (out / "s.png").is_file()


@pytest.mark.parametrize("kind", KINDS[::2], ids=[k[0] for k in KINDS[::2]])
def test_a_grid_of_checkpoints_in_the_folder(tmp_path, kind):
    """The grid's model paths and its --out in the folder: the numbers of the same models elsewhere, and
    a rerun reuses every unit (the models' fingerprints are read back)."""
    import shutil

    import lmc_fast.grid as grid

    _, paths = _checkpoints(tmp_path, kind)
    plain = [shutil.copytree(p, tmp_path / f"plain{s}") for s, p in enumerate(paths)]
    if kind[0] == "hf-folder":
        corpus = tmp_path / "c.txt"
        corpus.write_text("the quick brown fox jumps over the lazy dog. " * 40)
        data = {"spec": f"text:{corpus}", "max_batches": 1, "batch_size": 2, "block_size": 16}
    else:
        data = {"spec": "digits", "max_batches": 1, "batch_size": 8}

    def spec(models):
        return {"data": data, "models": {"paths": [str(p) for p in models]},
                "grid": {"pairs": "all", "methods": ["none", "weight"], "lambdas": 3}, "methods": {}}

    got = grid.run(spec(paths), tmp_path / BAD / "grid", quiet=True)["records"]
    want = grid.run(spec(plain), tmp_path / "grid", quiet=True)["records"]
    assert [(r["barrier"], r["curve"]["loss"]) for r in got] == [(r["barrier"], r["curve"]["loss"]) for r in want]
    assert grid.run(spec(paths), tmp_path / BAD / "grid", quiet=True)["reused"] == len(got)


def test_a_name_that_is_not_utf8_prints_escaped_on_a_strict_stream():
    import io

    from lmc_fast.paths import print_line, printable

    stream = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict")
    print_line(f"-> {BAD}/out", stream)
    stream.flush()
    assert stream.buffer.getvalue() == b"-> ckpt-\\xff/out\n"
    assert printable("caf\u00e9", stream) == "caf\u00e9"  # what the stream can write stays as it is
    ascii_stream = io.TextIOWrapper(io.BytesIO(), encoding="ascii")
    assert printable("caf\u00e9", ascii_stream) == "caf\\xe9"
