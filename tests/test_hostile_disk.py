"""OS errors while writing (a full disk, no permission): every command that writes exits with
status 2 and one line naming the error, never a traceback, and leaves no partial output. The full
disk is simulated where safetensors reports it: in its own exception type (SafetensorError), which
once escaped as a traceback with exit status 1."""
import errno
from pathlib import Path

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


# ---------------------------------------------------------------- a failed write at any output
# (case id, command line, how many files a clean run publishes)
WRITES = [("align", COMMANDS[0][1], 2), ("merge", COMMANDS[1][1], 9),
          ("merge-stream", COMMANDS[1][1] + ["--stream", "--mode", "reference"], 9),
          ("train", ["train", "--model", "vit", "--data", "digits", "--seeds", "0", "1", "--steps", "1", "--limit", "32",
                     "--batch-size", "16", "--out", "{w}/out", *TINY_VIT], 5)]
AT_EVERY_WRITE = [(f"{name}-write{k}", name, argv, k) for name, argv, n in WRITES for k in range(1, n + 1)]
ERRORS = [("ENOSPC", errno.ENOSPC, "No space left on device"), ("EACCES", errno.EACCES, "Permission denied"),
          ("EDQUOT", errno.EDQUOT, "Disk quota exceeded"), ("EROFS", errno.EROFS, "Read-only file system"),
          ("EIO", errno.EIO, "Input/output error")]


def _fail_publishing(monkeypatch, k: int, code=errno.ENOSPC, text="No space left on device"):
    """The k-th file the command publishes fails where a full disk shows: flushing it (fsync) before its rename."""
    import lmc_fast.atomic as atomic

    real, seen = atomic.fsync_path, []

    def fsync_path(path):
        path = Path(path)
        if path.is_file() and path.parent.name.startswith(atomic.TEMP_PREFIX):
            seen.append(path)
            if len(seen) == k:
                raise OSError(code, text, str(path))
        real(path)

    monkeypatch.setattr(atomic, "fsync_path", fsync_path)
    return seen


def _snapshot(root):
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _one_line_exit_2(rc, err, text="No space left on device"):
    assert rc == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert text in err and ".lmcf-" not in err  # the output's name, not that of a temporary file


def _complete_seed_folders(out, also=()):
    """What a failed `train` may keep: whole checkpoints of the seeds finished before the failure."""
    kept = sorted(p.name for p in out.iterdir() if p.name not in also) if out.exists() else []
    for name in kept:
        assert name.startswith("seed") and sorted(f.name for f in (out / name).iterdir()) == ["config.json",
                                                                                           "model.safetensors"]
        load_model(out / name)
    return kept


@pytest.mark.parametrize("case", AT_EVERY_WRITE, ids=[c[0] for c in AT_EVERY_WRITE])
def test_a_failed_write_at_any_output_leaves_no_partial_output(vits, monkeypatch, capsys, case):
    """align and merge write all of their outputs or none; train keeps only the seeds it finished."""
    _, name, argv, k = case
    before = _files(vits)
    seen = _fail_publishing(monkeypatch, k)
    rc = main([a.format(w=vits) for a in argv] + ["-q"])
    _one_line_exit_2(rc, capsys.readouterr().err)
    assert len(seen) == k
    if name == "train":
        assert len(_complete_seed_folders(vits / "out")) == (k - 1) // 2  # two files per seed, then train.json
    else:
        assert _files(vits) == before  # not even the --out folder it made, nor a temp or kept file


@pytest.mark.parametrize("case", AT_EVERY_WRITE, ids=[c[0] for c in AT_EVERY_WRITE])
def test_a_failed_rerun_puts_back_the_outputs_it_replaced(vits, monkeypatch, capsys, case):
    _, name, argv, k = case
    argv = [a.format(w=vits) for a in argv] + ["-q"]
    assert main(argv) == 0
    capsys.readouterr()
    before = _snapshot(vits)
    _fail_publishing(monkeypatch, k)
    rc = main(argv)
    _one_line_exit_2(rc, capsys.readouterr().err)
    after = _snapshot(vits)
    assert sorted(after) == sorted(before)  # no file more (temps, kept copies) and none less
    if name == "train":  # seeds finished before the failure are the new ones; the failing one is the old one
        failing = [f"out/seed{(k - 1) // 2}/config.json", f"out/seed{(k - 1) // 2}/model.safetensors"] if k < 5 else []
        assert all(after[f] == before[f] for f in failing + ["out/train.json"])  # the old summary stays
        _complete_seed_folders(vits / "out", also=["train.json"])
    else:
        assert after == before


@pytest.mark.parametrize("error", ERRORS, ids=[e[0] for e in ERRORS])
@pytest.mark.parametrize("case", COMMANDS, ids=[c[0] for c in COMMANDS])
def test_every_os_error_of_a_write_is_one_line_and_leaves_nothing(vits, monkeypatch, capsys, case, error):
    _, argv = case
    _, code, text = error
    before = _files(vits)
    _fail_publishing(monkeypatch, 1, code, text)
    rc = main([a.format(w=vits) for a in argv] + ["-q"])
    _one_line_exit_2(rc, capsys.readouterr().err, text)
    assert _files(vits) == before


WRAPPED = [("full", 'Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left on device" })',
            "No space left on device"),
           ("permission", 'Error while serializing: IoError(Os { code: 13, kind: PermissionDenied, message: "Permission denied" })',
            "Permission denied")]


@pytest.mark.parametrize("wrapped", WRAPPED, ids=[w[0] for w in WRAPPED])
@pytest.mark.parametrize("case", COMMANDS, ids=[c[0] for c in COMMANDS])
def test_an_os_error_safetensors_wraps_midway_leaves_nothing(vits, monkeypatch, capsys, case, wrapped):
    """safetensors fails on a file (merge: its third, after two were published): what was published is removed."""
    import safetensors.torch

    _, argv = case
    _, message, text = wrapped
    real, calls = safetensors.torch.save_file, []

    def save_file(tensors, filename, metadata=None):
        calls.append(filename)
        if len(calls) == {"align": 1, "merge": 3, "train": 1}[case[0]]:
            with open(filename, "wb") as f:
                f.write(b"partial")
            raise SafetensorError(message)
        return real(tensors, filename, metadata=metadata)

    monkeypatch.setattr(safetensors.torch, "save_file", save_file)
    before = _files(vits)
    rc = main([a.format(w=vits) for a in argv] + ["-q"])
    _one_line_exit_2(rc, capsys.readouterr().err, text)
    assert _files(vits) == before


def test_a_failed_save_leaves_the_previous_checkpoint_whole(tmp_path, monkeypatch):
    """save_model on its own: the config's write fails after the new weights were renamed in; the old
    weights come back, so the folder is the previous checkpoint, bytes and all."""
    torch.manual_seed(0)
    save_model(ViT(ViTConfig.digits(d_model=16, n_layer=1, n_head=2, d_mlp=32)), tmp_path / "m")
    before = _snapshot(tmp_path)
    _fail_publishing(monkeypatch, 2)  # weights published, then the config fails
    torch.manual_seed(1)
    with pytest.raises(OSError, match="No space left on device"):
        save_model(ViT(ViTConfig.digits(d_model=16, n_layer=1, n_head=2, d_mlp=32)), tmp_path / "m")
    assert _snapshot(tmp_path) == before
