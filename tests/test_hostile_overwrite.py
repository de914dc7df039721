"""A file at an output path that lmc-fast did not write (notes, someone's JSON, another tool's
safetensors, an empty file) is never overwritten: the command exits 2 with one line naming it, before
any work, and the file stays as it was. Files a command wrote itself are replaced on a re-run."""
import json

import pytest
import torch
from safetensors.torch import save_file

from lmc_fast.cli import main
from lmc_fast.io import save_model
from lmc_fast.models import ViT, ViTConfig

CURVE = {"lambdas": [0.0, 0.5, 1.0], "loss": [1.0, 2.0, 1.0], "acc": [0.9, 0.5, 0.9], "barrier": 1.0}


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    root = tmp_path_factory.mktemp("overwrite")
    for s in range(2):
        torch.manual_seed(s)
        save_model(ViT(ViTConfig.digits(d_model=16, n_layer=1, n_head=2, d_mlp=32)), root / f"seed{s}",
                   metadata={"data": "digits"})
    (root / "r.json").write_text(json.dumps({"kind": "sweep", "results": {"weight": CURVE}}))
    return root


def _notes(path):
    path.write_text("my notes, not a result\n")


def _json_without_kind(path):
    path.write_text(json.dumps({"loss": [1, 2, 3]}))


def _other_safetensors(path):
    save_file({"w": torch.ones(2)}, str(path), metadata={"format": "pt"})


def _empty(path):
    path.write_bytes(b"")


def _fake_png(path):
    path.write_bytes(b"GIF89a" + b"\0" * 16)


# (case id, command line after `lmc-fast` ({w}: the work folder, {o}: this test's folder), the output
# path the foreign file sits at, its maker)
CASES = [
    ("align-out-other-safetensors", ["align", "{w}/seed0", "{w}/seed1", "--out", "{o}/al.safetensors"],
     "al.safetensors", _other_safetensors),
    ("align-out-empty", ["align", "{w}/seed0", "{w}/seed1", "--out", "{o}/al.safetensors"], "al.safetensors", _empty),
    ("align-summary-notes", ["align", "{w}/seed0", "{w}/seed1", "--out", "{o}/al.safetensors"],
     "al.align.json", _notes),
    ("sweep-out-json-without-kind", ["sweep", "{w}/seed0", "{w}/seed1", "--lambdas", "3", "--max-batches", "1",
                                     "--out", "{o}/s.json"], "s.json", _json_without_kind),
    ("sweep-plot-gif", ["sweep", "{w}/seed0", "{w}/seed1", "--lambdas", "3", "--max-batches", "1", "--out",
                        "{o}/s.json", "--plot", "{o}/s.png"], "s.png", _fake_png),
    ("plot-out-notes", ["plot", "{w}/r.json", "--out", "{o}/fig.svg"], "fig.svg", _notes),
    ("merge-json-notes", ["merge", "{w}/seed0", "{w}/seed1", "--out", "{o}/m"], "m/merge.json", _notes),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_a_file_lmc_fast_did_not_write_is_not_overwritten(work, tmp_path, capsys, case):
    _, argv, name, make = case
    target = tmp_path / name
    target.parent.mkdir(parents=True, exist_ok=True)
    make(target)
    before = target.read_bytes()
    listing = sorted(p.name for p in tmp_path.rglob("*"))
    rc = main([a.format(w=work, o=tmp_path) for a in argv] + ["-q"])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert f"{target.name}: exists and was not written by lmc-fast" in err
    assert target.read_bytes() == before
    assert sorted(p.name for p in tmp_path.rglob("*")) == listing  # nothing else written either


def test_a_commands_own_outputs_are_replaced_on_a_rerun(work, tmp_path, capsys):
    argv = ["sweep", f"{work}/seed0", f"{work}/seed1", "--lambdas", "3", "--max-batches", "1", "--out",
            f"{tmp_path}/s.json", "--plot", f"{tmp_path}/s.pdf", "-q"]
    assert main(argv) == 0
    assert main(argv) == 0, capsys.readouterr().err
    align = ["align", f"{work}/seed0", f"{work}/seed1", "--out", f"{tmp_path}/al.safetensors", "-q"]
    assert main(align) == 0 and main(align) == 0, capsys.readouterr().err
