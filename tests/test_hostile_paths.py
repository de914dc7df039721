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
