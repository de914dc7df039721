"""OS errors while writing (a full disk, no permission): every command that writes exits with
status 2 and one line naming the error, never a traceback, and leaves no partial output. The full
disk is simulated where safetensors reports it: in its own exception type (SafetensorError), which
once escaped as a traceback with exit status 1."""
import errno

import pytest
import torch
from safetensors import SafetensorError

import lmc_fast as lf
from lmc_fast.atomic import atomic_file, os_error_of
from lmc_fast.cli import main
from lmc_fast.io import load_model, save_model
from lmc_fast.models import ViT, ViTConfig

FULL = 'Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left on device" })'
TINY_VIT = ["--config", "d_model=16", "n_layer=1", "n_head=2", "d_mlp=32"]


@pytest.fixture
def full_disk(monkeypatch):
    import safetensors.torch

    def save_file(tensors, filename, metadata=None):
        with open(filename, "wb") as f:
            f.write(b"partial")  # the writer got this far before the disk filled
        raise SafetensorError(FULL)

    monkeypatch.setattr(safetensors.torch, "save_file", save_file)


@pytest.fixture
def vits(tmp_path):
    for s in range(2):
        torch.manual_seed(s)
        save_model(ViT(ViTConfig.digits(d_model=16, n_layer=1, n_head=2, d_mlp=32)), tmp_path / f"seed{s}")
    return tmp_path


def _files(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


# (case id, command line after `lmc-fast`; {w} is the folder of the two checkpoints)
COMMANDS = [
    ("align", ["align", "{w}/seed0", "{w}/seed1", "--out", "{w}/out/al.safetensors"]),
    ("merge", ["merge", "{w}/seed0", "{w}/seed1", "--out", "{w}/out"]),
    ("train", ["train", "--model", "vit", "--data", "digits", "--seeds", "0", "--steps", "1", "--limit", "32",
               "--batch-size", "16", "--out", "{w}/out", *TINY_VIT]),
]


@pytest.mark.parametrize("case", COMMANDS, ids=[c[0] for c in COMMANDS])
def test_a_full_disk_is_one_line_exit_2_and_no_partial_output(vits, full_disk, capsys, case):
    _, argv = case
    before = _files(vits)
    rc = main([a.format(w=vits) for a in argv] + ["-q"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "No space left on device" in err
    assert [f for f in _files(vits) if f not in before and f != "out"] == []  # no partial file, no temp left
    assert not any((vits / "out").rglob("*")) if (vits / "out").exists() else True


def test_the_library_raises_the_os_error(vits, full_disk):
    a, b = load_model(vits / "seed0"), load_model(vits / "seed1")
    al = lf.align(a, b, "weight")
    with pytest.raises(OSError) as info:
        al.save(vits / "al.safetensors")
    assert info.value.errno == errno.ENOSPC and "al.safetensors" in str(info.value)
    assert not (vits / "al.safetensors").exists()


def test_other_writer_errors_are_not_called_os_errors(tmp_path):
    with pytest.raises(ValueError, match="not an OS error"):
        with atomic_file(tmp_path / "x.bin") as tmp:
            tmp.write_bytes(b"x")
            raise ValueError("not an OS error")
    assert os_error_of(SafetensorError("Error while serializing: HeaderTooLarge"), "p") is None
    assert not list(tmp_path.iterdir())
