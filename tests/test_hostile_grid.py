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
from lmc_fast.grid.report import REPORT_FILES
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


@pytest.mark.parametrize("name", sorted(REPORT_FILES))
def test_run_refuses_a_spec_path_that_is_one_of_its_outputs(tmp_path, vits, name):
    out = tmp_path / "o"
    out.mkdir()
    spec = _toml(_spec(vits), out / name)
    before = spec.read_bytes()
    with pytest.raises(ValueError, match=f"input .*{name} is the grid's output"):
        grid.run(spec, out, quiet=True)
    assert spec.read_bytes() == before
    _nothing_ran(out)


@pytest.mark.parametrize("folder", ["units", "alignments", "sweeps"])
def test_run_refuses_a_spec_inside_a_folder_the_grid_writes(tmp_path, vits, folder):
    out = tmp_path / "o"
    (out / folder).mkdir(parents=True)
    spec = _toml(_spec(vits), out / folder / "spec.toml")
    before = spec.read_bytes()
    with pytest.raises(ValueError, match=f"input .*spec.toml is inside {folder}/ of"):
        grid.run(spec, out, quiet=True)
    assert spec.read_bytes() == before
    assert list((out / folder).iterdir()) == [spec] and not (out / "results.jsonl").exists()


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


def _text_corpus(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog. " * 40)
    return corpus


def _foreign_trace_name(tmp_path, models):
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "unit0-none.json").write_text("my notes\n")  # the name the trace of unit 0 takes
    return tmp_path / "traces"


def _link_at_trace_name(tmp_path, models):
    (tmp_path / "traces").mkdir()
    (tmp_path / "mine.txt").write_text("mine\n")
    (tmp_path / "traces" / "unit0-none.json").symlink_to(tmp_path / "mine.txt")
    return tmp_path / "traces"


# (case id, the --profile path from (tmp_path, model paths), made as needed; what the one line says): inputs, files of the
# user's, the grid's own outputs; all refused before the first unit and left as they were
PROFILES = [
    ("the-spec-file", lambda t, m: t / "spec.toml", "exists and is not a folder"),
    ("the-data-file", lambda t, m: t / "corpus.txt", "exists and is not a folder"),
    ("a-model-folder", lambda t, m: Path(m[0]), "is an input or inside one"),
    ("inside-a-model-folder", lambda t, m: Path(m[0]) / "traces", "is an input or inside one"),
    ("a-model-weights-file", lambda t, m: Path(m[0]) / "model.safetensors", "exists and is not a folder"),
    ("a-file-of-the-users", lambda t, m: (t / "notes.json").write_text("{}") and t / "notes.json",
     "exists and is not a folder"),
    ("a-foreign-file-at-a-trace-name", _foreign_trace_name, "unit0-none.json is there and is not a trace a grid wrote"),
    ("a-link-at-a-trace-name", _link_at_trace_name, "unit0-none.json is there and is not a trace a grid wrote"),
    ("the-grids-units-folder", lambda t, m: t / "o" / "units", "inside the grid's own outputs"),
    ("a-report-file", lambda t, m: t / "o" / "summary.md", "inside the grid's own outputs"),
]


@pytest.mark.parametrize("case", PROFILES, ids=[c[0] for c in PROFILES])
def test_a_profile_path_that_is_an_input_or_not_ours_is_refused_before_any_unit(tmp_path, gpts, case):
    _, where, message = case
    corpus = _text_corpus(tmp_path)
    spec_path = _toml(_spec(gpts, f"text:{corpus}"), tmp_path / "spec.toml")
    profile = where(tmp_path, gpts)
    before = {p: p.read_bytes() for p in [*tmp_path.rglob("*"), *Path(gpts[0]).rglob("*")] if p.is_file()}
    with pytest.raises(ValueError, match=f"--profile .*{message}") as info:
        grid.run(spec_path, tmp_path / "o", quiet=True, profile=profile)
    assert "\n" not in str(info.value)
    _nothing_ran(tmp_path / "o")
    assert {p: p.read_bytes() for p in before} == before


@pytest.mark.parametrize("case", [PROFILES[0], PROFILES[6]], ids=[PROFILES[0][0], PROFILES[6][0]])
def test_lmc_fast_grid_refuses_such_a_profile_in_one_line(tmp_path, vits, capsys, case):
    from lmc_fast.cli import main

    _, where, message = case
    spec_path = _toml(_spec(vits), tmp_path / "spec.toml")
    profile = where(tmp_path, vits)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    rc = main(["grid", str(spec_path), "--out", str(tmp_path / "o"), "--profile", str(profile), "-q"])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and message in err and "Traceback" not in err
    assert {p: p.read_bytes() for p in before} == before
    _nothing_ran(tmp_path / "o")


def test_the_grids_own_trace_is_replaced_on_a_rerun(tmp_path, vits):
    out, traces = tmp_path / "o", tmp_path / "traces"
    grid.run(_spec(vits), out, quiet=True, profile=traces)
    (trace,) = traces.iterdir()
    first = trace.read_bytes()
    grid.run(_spec(vits), out, quiet=True, resume=False, profile=traces)
    assert [p.name for p in traces.iterdir()] == [trace.name]  # replaced, no temp left
    assert trace.read_bytes() != first and b'"traceEvents"' in trace.read_bytes()


# ---------------------------------------------------------------- unit records edited by hand


def _pair_edit(field, change):
    def edit(r):
        if r.get("kind", "pair") == "pair":
            r[field] = change(r[field])
    return edit


def _curve_edit(field, change):
    def edit(r):
        if "curve" in r:
            r["curve"][field] = change(r["curve"][field])
    return edit


def _simplex_edit(field, change):
    def edit(r):
        if r.get("kind") == "simplex":
            r[field] = change(r[field])
    return edit


def _drop(field):
    def edit(r):
        r.pop(field, None)
    return edit


def _acc_everywhere(r):
    """The accuracy at 0.5 edited in the curve, in acc_mid and in both accuracy barriers: every number
    derived from it agrees; only the calibration bins it was computed from do not."""
    if "curve" not in r:
        return
    c = r["curve"]
    j = c["lambdas"].index(0.5)
    c["acc"][j] = r["acc_mid"] = c["acc"][j] + 0.25 if c["acc"][j] <= 0.75 else c["acc"][j] - 0.25
    drop = max((1 - t) * c["acc_a"] + t * c["acc_b"] - v for v, t in zip(c["acc"], c["lambdas"]))
    c["acc_barrier"] = r["acc_barrier"] = drop


# (case id, edit of every stored unit record)
RECORDS = [
    ("string-barrier", _pair_edit("barrier", str)),
    ("missing-curve", lambda r: r.pop("curve", None)),
    ("barrier-edited", _pair_edit("barrier", lambda b: b + 1.0)),
    ("negative-barrier-below-the-curve", _pair_edit("barrier", lambda b: -5.0)),
    ("acc-mid-above-one", _pair_edit("acc_mid", lambda a: 5.0)),
    ("loss-mid-edited", _pair_edit("loss_mid", lambda v: v / 2)),
    ("curve-shortened", _curve_edit("loss", lambda v: v[:-1])),
    ("curve-loss-edited", _curve_edit("loss", lambda v: [x * 2 for x in v])),
    ("curve-string-point", _curve_edit("acc", lambda v: ["x"] + v[1:])),
    ("examples-missing", _drop("examples")),
    ("centroid-string", _simplex_edit("centroid", str)),
    ("centroid-edited", _simplex_edit("centroid", lambda c: c - 3.0)),
    ("worst-edited", _simplex_edit("worst", lambda w: -1.0)),
    ("simplex-samples-cut", lambda r: r.get("simplex", {}).get("samples", [None]).pop()),
    # numbers that are not numbers, counts out of range (json.dumps writes NaN as a bare NaN)
    ("nan-barrier", _pair_edit("barrier", lambda b: float("nan"))),
    ("nan-in-the-curve", _curve_edit("loss", lambda v: [float("nan")] + v[1:])),
    ("inf-centroid", _simplex_edit("centroid", lambda c: float("inf"))),
    ("negative-examples", lambda r: r.__setitem__("examples", -r["examples"])),
    ("negative-rank", lambda r: r.__setitem__("rank", -1)),
    ("string-rank", lambda r: r.__setitem__("rank", "0")),
    ("date-a-number", lambda r: r.__setitem__("date", 20240101)),
    ("negative-peak-bytes", _pair_edit("memory", lambda m: dict(m, peak_bytes=-1))),
    ("memory-a-string", _pair_edit("memory", str)),
    ("reliability-count-negative", _curve_edit("reliability", lambda v: [dict(d, n=[-c for c in d["n"]]) for d in v])),
    # fields of another grid, unit or kind
    ("other-data", lambda r: r.__setitem__("data", "fashion-mnist")),
    ("other-split", lambda r: r.__setitem__("split", "train")),
    ("other-space", lambda r: r.__setitem__("space", "canonical")),
    ("other-alpha", _simplex_edit("alpha", lambda a: 2 * a)),
    ("alpha-a-string", _simplex_edit("alpha", str)),
    ("an-alignment-for-a-method-without", _pair_edit("alignment", lambda a: "alignments/x.safetensors")),
    ("alignment-reused-a-string", _pair_edit("alignment_reused", lambda a: "no")),
    ("info-a-string", lambda r: r.__setitem__("info", "x")),
    ("simplex-alignments-not-a-list", _simplex_edit("alignments", lambda a: 5)),
    ("curve-adaptive", _curve_edit("adaptive", lambda a: {"evaluations": 3})),
    ("curve-other-space", _curve_edit("space", lambda v: "canonical")),
    ("curve-extra-field", lambda r: r.get("curve", {}).__setitem__("note", 1)),
    ("simplex-extra-field", lambda r: r.get("simplex", {}).__setitem__("note", 1)),
    # edits that keep the edited numbers agreeing with each other, but not with the rest
    ("curve-ppl-a-string", _curve_edit("ppl", lambda v: "x")),
    ("signed-max-edited", _curve_edit("signed_max", lambda v: v + 1.0)),
    ("reliability-shortened", _curve_edit("reliability", lambda v: v[:-1])),
    ("acc-edited-with-acc-mid-and-barrier", lambda r: _acc_everywhere(r)),
    ("sample-loss-edited", _simplex_edit("simplex", lambda s: dict(s, samples=[dict(s["samples"][0],
                                                                                  loss=s["samples"][0]["loss"] + 1)]
                                                                    + s["samples"][1:]))),
    ("model-row-mixed", _simplex_edit("simplex", lambda s: dict(s, models=[dict(s["models"][0], weights=[0.5, 0.5])]
                                                                 + s["models"][1:]))),
]


def _simplex_spec(paths):
    spec = _spec(paths)
    spec["simplex"] = {"groups": [[0, 1]], "methods": ["none"], "samples": 3}
    return spec


@pytest.mark.parametrize("case", RECORDS, ids=[c[0] for c in RECORDS])
def test_an_edited_unit_record_is_computed_again(tmp_path, vits, case):
    _, edit = case
    out = tmp_path / "o"
    first = grid.run(_simplex_spec(vits), out, quiet=True)["records"]
    for path in (out / "units").glob("*.json"):
        record = json.loads(path.read_text())
        edit(record)
        path.write_text(json.dumps(record))
    with pytest.warns(UserWarning, match=r"units/\w+\.json: damaged unit record"):
        again = grid.run(_simplex_spec(vits), out, quiet=True)
    assert again["reused"] < len(first)
    assert _numbers(again["records"]) == _numbers(first)


def _truncated(text, others):
    return text[: len(text) // 2]


def _another_units(text, others):
    return others[0]


# (case id, the file's new text from its text and the other unit files' texts)
RECORD_FILES = [("truncated", _truncated), ("empty", lambda t, o: ""), ("last-brace-missing", lambda t, o: t.rstrip()[:-1]),
                ("json-null", lambda t, o: "null"), ("json-list", lambda t, o: "[]"),
                ("nested-too-deeply", lambda t, o: "[" * 100_000 + "]" * 100_000),
                ("another-units-record", _another_units)]


@pytest.mark.parametrize("case", RECORD_FILES, ids=[c[0] for c in RECORD_FILES])
def test_a_damaged_unit_file_is_computed_again(tmp_path, vits, case):
    """A unit file cut short, emptied, replaced by other JSON or by the record of another unit: a
    warning naming it, the unit computed again, every output as a clean run's."""
    _, change = case
    out = tmp_path / "o"
    first = grid.run(_simplex_spec(vits), out, quiet=True)["records"]
    paths = sorted((out / "units").glob("*.json"))
    texts = [p.read_text() for p in paths]
    for k, path in enumerate(paths):
        path.write_text(change(texts[k], texts[k + 1:] + texts[:k]))
    with pytest.warns(UserWarning, match=r"units/\w+\.json: damaged unit record"):
        again = grid.run(_simplex_spec(vits), out, quiet=True)
    assert again["reused"] == 0 and again["computed"] == len(first)
    assert _numbers(again["records"]) == _numbers(first)
    assert grid.run(_simplex_spec(vits), out, quiet=True)["reused"] == len(first)  # the files were rewritten
    summary = (out / "summary.csv").read_text()
    grid.run(_simplex_spec(vits), out, quiet=True, resume=False)
    assert (out / "summary.csv").read_text() == summary  # the summary is a clean run's


def test_a_folder_at_a_units_name_is_refused_before_any_unit(tmp_path, vits):
    out = tmp_path / "o"
    grid.run(_spec(vits), out, quiet=True)
    (record,) = (out / "units").glob("*.json")
    record.unlink()
    (record / "mine").mkdir(parents=True)
    before = {p: p.read_bytes() for p in out.iterdir() if p.is_file()}
    with pytest.raises(ValueError, match=rf"{record.name}: is not a file") as info:
        grid.run(_spec(vits), out, quiet=True)
    assert "\n" not in str(info.value) and (record / "mine").is_dir()
    assert {p: p.read_bytes() for p in out.iterdir() if p.is_file()} == before  # no report rewritten
    assert not list((out / "sweeps").iterdir())  # no unit started


def _numbers(obj):
    """The records without their timings and dates (what a recomputation may change)."""
    if isinstance(obj, dict):
        return {k: _numbers(v) for k, v in obj.items() if k not in ("seconds", "date", "memory")}
    if isinstance(obj, list):
        return [_numbers(v) for v in obj]
    return obj


@pytest.mark.parametrize("foreign", ["model", "notes"])
def test_a_recipe_model_folder_holding_something_else_is_refused_before_training(tmp_path, foreign):
    """OUT/models/seedN holds a model the grid did not train (no recipe metadata) or other files: refused
    in one line before anything is trained or written, and left as it was."""
    spec = {"models": {"recipe": "vit-digits", "seeds": [0, 1], "steps": 2},
            "data": {"max_batches": 1}, "grid": {"methods": ["none"], "lambdas": 2}}
    out = tmp_path / "g"
    seed1 = out / "models" / "seed1"
    if foreign == "model":
        save_model(ViT(ViTConfig.digits(d_model=16, n_layer=1, n_head=2, d_mlp=32)), seed1, metadata={"mine": 1})
    else:
        seed1.mkdir(parents=True)
        (seed1 / "notes.txt").write_text("keep me")
    before = {p: p.read_bytes() for p in seed1.iterdir()}
    with pytest.raises(ValueError, match="holds something a grid did not train"):
        grid.run(spec, out, quiet=True)
    assert {p: p.read_bytes() for p in seed1.iterdir()} == before
    assert not (out / "models" / "seed0").exists()  # nothing trained before the refusal
