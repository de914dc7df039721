"""Hostile grid outputs: every output path is checked against every input (the spec file, the
[data] file, the models) and against what is already in --out before any unit runs; an input is
never written, and a file at an output's name that a grid did not write is never overwritten."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import lmc_fast.grid as grid
from lmc_fast.io import save_model
from lmc_fast.models import GPT2, GPT2Config, ViT, ViTConfig
from test_grid import _toml

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def vits(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hostile_grid_vits")
    paths = []
    for seed in range(2):  # untrained: the paths, not the models, are under test
        torch.manual_seed(seed)
        save_model(ViT(ViTConfig.digits(d_model=16, n_layer=1, n_head=2, d_mlp=32)), folder / f"m{seed}")
        paths.append(str(folder / f"m{seed}"))
    return paths


@pytest.fixture(scope="module")
def gpts(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hostile_grid_gpts")
    paths = []
    for seed in range(2):
        torch.manual_seed(seed)
        save_model(GPT2(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=256, block_size=16)), folder / f"g{seed}")
        paths.append(str(folder / f"g{seed}"))
    return paths


def _spec(paths, data="digits"):
    return {"data": {"spec": data, "max_batches": 2, "batch_size": 8}, "models": {"paths": paths},
            "grid": {"pairs": "all", "methods": ["none"], "lambdas": 3}, "methods": {}}


def _nothing_ran(out: Path):
    assert not (out / "units").exists() and not (out / "sweeps").exists()


# (case id, the report file the spec is stored as)
SPEC_AS_OUTPUT = ["summary.md", "summary.csv", "results.jsonl", "grid.json", "barriers.png"]


@pytest.mark.parametrize("name", SPEC_AS_OUTPUT)
def test_cli_refuses_a_spec_file_that_is_one_of_its_outputs(tmp_path, vits, name):
    out = tmp_path / "o"
    out.mkdir()
    spec = _toml(_spec(vits), out / name)
    before = spec.read_bytes()
    r = subprocess.run([sys.executable, "-m", "lmc_fast.cli", "grid", str(spec), "--out", str(out), "-q"],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert len(r.stderr.strip().splitlines()) == 1 and name in r.stderr
    assert spec.read_bytes() == before
    _nothing_ran(out)


@pytest.mark.parametrize("name", ["summary.md", "results.jsonl"])
def test_run_refuses_a_spec_path_that_is_one_of_its_outputs(tmp_path, vits, name):
    out = tmp_path / "o"
    out.mkdir()
    spec = _toml(_spec(vits), out / name)
    before = spec.read_bytes()
    with pytest.raises(ValueError, match=f"input .*{name} is the grid's output"):
        grid.run(spec, out, quiet=True)
    assert spec.read_bytes() == before
    _nothing_ran(out)


@pytest.mark.parametrize("name", ["results.jsonl", "summary.md", "summary.csv"])
def test_a_data_file_inside_out_named_like_an_output_is_not_overwritten(tmp_path, gpts, name):
    out = tmp_path / "o"
    out.mkdir()
    corpus = out / name
    corpus.write_text("the quick brown fox jumps over the lazy dog. " * 40)
    before = corpus.read_bytes()
    with pytest.raises(ValueError, match=f"input .*{name} is the grid's output"):
        grid.run(_spec(gpts, f"text:{corpus}"), out, quiet=True)
    assert corpus.read_bytes() == before
    _nothing_ran(out)


def _notes(path):
    path.write_text("my own notes\n")


def _not_png(path):
    path.write_bytes(b"GIF89a not a png")


def _other_json(path):
    path.write_text(json.dumps({"kind": "something else"}))


def _lines_without_keys(path):
    path.write_text('{"a": 1}\n{"b": 2}\n')


# (case id, output name, maker of a file a grid did not write)
FOREIGN = [("notes-at-summary.md", "summary.md", _notes), ("notes-at-summary.csv", "summary.csv", _notes),
           ("gif-at-barriers.png", "barriers.png", _not_png), ("gif-at-curves.png", "curves.png", _not_png),
           ("other-json-at-grid.json", "grid.json", _other_json),
           ("other-lines-at-results.jsonl", "results.jsonl", _lines_without_keys),
           ("folder-at-summary.md", "summary.md", lambda p: p.mkdir())]


@pytest.mark.parametrize("case", FOREIGN, ids=[c[0] for c in FOREIGN])
def test_a_file_the_grid_did_not_write_is_never_overwritten(tmp_path, vits, case):
    _, name, make = case
    out = tmp_path / "o"
    out.mkdir()
    make(out / name)
    before = (out / name).read_bytes() if (out / name).is_file() else None
    with pytest.raises(ValueError, match=f"{name}: exists and was not written by a grid"):
        grid.run(_spec(vits), out, quiet=True)
    assert (out / name).is_dir() if before is None else (out / name).read_bytes() == before
    _nothing_ran(out)


def test_the_grids_own_outputs_are_replaced_on_a_rerun(tmp_path, vits):
    out = tmp_path / "o"
    first = grid.run(_spec(vits), out, quiet=True)["records"]
    again = grid.run(_spec(vits), out, quiet=True, resume=False)["records"]
    assert [r["barrier"] for r in again] == [r["barrier"] for r in first]


def test_profile_that_is_a_file_is_refused_before_any_unit(tmp_path, vits):
    out, trace = tmp_path / "o", tmp_path / "trace.json"
    trace.write_text("{}")
    with pytest.raises(ValueError, match="--profile .*is not a folder"):
        grid.run(_spec(vits), out, quiet=True, profile=trace)
    _nothing_ran(out)
    assert trace.read_text() == "{}"
