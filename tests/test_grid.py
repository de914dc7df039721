"""`lmc_fast.grid`: spec validation, outputs, resume (also after SIGKILL) and 2 gloo ranks = 1 process."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import lmc_fast.grid as grid
from lmc_fast.grid.spec import parse_spec

ROOT = Path(__file__).resolve().parents[1]
METHODS = ["none", "permutation", "weight"]


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> list[str]:
    """Three tiny ViTs, a few training steps each (so their barriers are not all zero)."""
    from lmc_fast.data import load_digits
    from lmc_fast.io import save_model
    from lmc_fast.models import ViT, ViTConfig
    from lmc_fast.train import train

    folder = tmp_path_factory.mktemp("grid_models")
    train_ds = load_digits("train")
    paths = []
    for seed in range(3):
        torch.manual_seed(seed)
        m = ViT(ViTConfig.digits(d_model=16, n_layer=1, n_head=2, d_mlp=32))
        train(m, train_ds, steps=40, batch_size=64, lr=1e-2, seed=seed, progress=False)
        save_model(m, folder / f"seed{seed}")
        paths.append(str(folder / f"seed{seed}"))
    return paths


def _spec(paths, methods=METHODS, options=None) -> dict:
    return {"data": {"spec": "digits", "max_batches": 2, "batch_size": 128}, "models": {"paths": paths},
            "grid": {"pairs": "all", "methods": methods, "lambdas": 3}, "methods": options or {}}


def _toml(spec: dict, path: Path) -> Path:
    def value(v):
        return json.dumps(v)  # TOML accepts JSON strings, numbers and arrays

    lines = []
    for table in ("data", "models", "grid"):
        lines.append(f"[{table}]")
        lines += [f"{k} = {value(v)}" for k, v in spec[table].items()]
    for method, opts in spec.get("methods", {}).items():
        lines.append(f"[methods.{method}]")
        lines += [f"{k} = {value(v)}" for k, v in opts.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


def _assert_same(got: list[dict], want: list[dict], rel: float):
    assert [(r["pair"], r["method"]) for r in got] == [(r["pair"], r["method"]) for r in want]
    for g, w in zip(got, want):
        for key in ("barrier", "acc_barrier", "loss_mid", "acc_mid"):
            assert g[key] == pytest.approx(w[key], rel=rel, abs=1e-12), (g["method"], key)
        for key in ("loss", "acc"):
            assert g["curve"][key] == pytest.approx(w["curve"][key], rel=rel, abs=1e-12)


@pytest.fixture(scope="module")
def reference(models, tmp_path_factory) -> Path:
    """One uninterrupted single-process run: what every other way of running must reproduce."""
    out = tmp_path_factory.mktemp("grid_ref")
    grid.run(_spec(models), out, quiet=True)
    return out


def _env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    env.pop("WORLD_SIZE", None)
    return env


# ---------------------------------------------------------------- spec
@pytest.mark.parametrize("change, message", [
    (lambda s: s["grid"].update(pairs=[[0, 7]]), r"grid\.pairs: index 7 out of range for 3 models"),
    (lambda s: s["grid"].update(pairs="some"), r"grid\.pairs: must be"),
    (lambda s: s["grid"].update(methods=["weight", "magic"]), r"grid\.methods: unknown method 'magic'"),
    (lambda s: s["grid"].update(lambdas=1), r"grid\.lambdas: a count must be in \[2"),
    (lambda s: s["grid"].update(lambdas=[0.5, 2]), r"grid\.lambdas: values must be numbers in \[0, 1\]"),
    (lambda s: s["grid"].update(colour="red"), r"grid\.colour: unknown key"),
    (lambda s: s.update(extra={}), r"extra: unknown key"),
    (lambda s: s["data"].pop("spec"), r"data\.spec: required"),
    (lambda s: s["data"].update(batch_size=0), r"data\.batch_size: must be >= 1"),
    (lambda s: s["models"].update(paths=["only-one"]), r"models\.paths: must list at least two"),
    (lambda s: s["models"].update(recipe="vit-digits"), r"models: give either paths"),
    (lambda s: s.update(methods={"weight": {"steps": 3}}), r"methods\.weight\.steps: unknown option"),
    (lambda s: s.update(methods={"learned": {"augment": "blur"}}), r"methods\.learned\.augment: one of"),
    (lambda s: s.update(methods={"none": {"seed": 1}}), r"methods\.none\.seed: unknown option; none takes none"),
])
def test_bad_spec_names_the_key(change, message):
    spec = _spec(["a", "b", "c"])
    change(spec)
    with pytest.raises(ValueError, match=message) as info:
        parse_spec(spec)
    assert "\n" not in str(info.value)


def test_spec_from_toml_and_recipe_defaults(tmp_path):
    spec = grid.load_spec(_toml(_spec(["a", "b", "c"], options={"learned": {"steps": 30}}), tmp_path / "g.toml"))
    assert spec.pairs == ((0, 1), (0, 2), (1, 2)) and spec.lambdas == (0.0, 0.5, 1.0)
    assert spec.options == {"learned": {"steps": 30}}
    r = parse_spec({"models": {"recipe": "vit-digits", "seeds": [0, 1, 2], "epochs": 2},
                    "grid": {"pairs": "consecutive"}})
    assert r.data == "digits" and r.pairs == ((0, 1), (1, 2)) and r.train == {"epochs": 2}
    (tmp_path / "bad.toml").write_text("[grid\n")
    with pytest.raises(ValueError, match="not valid TOML"):
        grid.load_spec(tmp_path / "bad.toml")


def test_learned_keys_follow_the_presets_they_rely_on(monkeypatch):
    """A learned column's key holds the settings of every preset its options may resolve to: changing a preset's
    value, or the default rule's threshold, changes the key of a column that relies on it (a resumed grid
    recomputes it) and not of one whose options set that value, nor of any other method's column."""
    import lmc_fast.match.learned as learned
    from lmc_fast.grid.units import alignment_key

    spec = parse_spec(_spec(["a", "b"], methods=["weight", "learned", "learned-lr", "learned-paper"],
                            options={"learned": {"steps": 4}, "learned-lr": {"method": "learned", "lr": 0.3},
                                     "learned-paper": {"method": "learned", "preset": "paper"}}))

    def keys():
        return {m: alignment_key(spec, "fa", "fb", m) for m in spec.methods}

    before = keys()
    assert len(set(before.values())) == 4
    monkeypatch.setitem(learned.PRESETS, "labels-loop", {**learned.PRESETS["labels-loop"], "lr": 0.5})
    after = keys()
    assert after["learned"] != before["learned"]  # relies on the default preset's lr
    assert {m: after[m] for m in ("weight", "learned-lr", "learned-paper")} == \
        {m: before[m] for m in ("weight", "learned-lr", "learned-paper")}
    monkeypatch.setattr(learned, "MEMORISED_LOSS", 0.2)
    moved = keys()
    assert moved["learned"] != after["learned"] and moved["learned-lr"] != after["learned-lr"]  # "default" reads it
    assert moved["learned-paper"] == before["learned-paper"] and moved["weight"] == before["weight"]


# ---------------------------------------------------------------- one process
def test_outputs(reference, models):
    records = _records(reference)
    assert len(records) == 3 * len(METHODS)
    r = records[1]
    assert r["pair"] == [0, 1] and r["method"] == "permutation" and r["a"] == models[0] and r["b"] == models[1]
    assert r["space"] == "raw" and set(r["seconds"]) == {"load", "solve", "canonicalise", "sweep", "write"}
    assert r["memory"]["source"] == "planned (sweep estimate)" and r["memory"]["peak_bytes"] > 0  # CPU: the plan
    assert r["memory"]["blocks"] == 1 and r["memory"]["mixtures_per_block"] == 3
    assert r["curve"]["lambdas"] == [0.0, 0.5, 1.0] and r["info"]["fingerprint_a"]
    assert (reference / r["alignment"]).is_file() and records[0]["alignment"] is None
    assert any(x["barrier"] > 1e-4 for x in records)  # trained a little: a real (if small) measurement
    lines = (reference / "summary.csv").read_text().splitlines()
    assert lines[0].startswith("method,n,barrier_median,barrier_min,barrier_max,barrier_mean,barrier_std,acc_mid_")
    assert [line.split(",")[:2] for line in lines[1:]] == [[m, "3"] for m in METHODS]
    assert "| weight | 3 |" in (reference / "summary.md").read_text()
    for png in ("barriers.png", "curves.png"):
        assert (reference / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_resume_recomputes_only_what_changed(models, reference, tmp_path):
    out = tmp_path / "g"
    first = grid.run(_spec(models), out, quiet=True)
    assert first["computed"] == 9 and first["reused"] == 0
    _assert_same(_records(out), _records(reference), rel=1e-9)
    stamps = {p.name: p.stat().st_mtime_ns for p in (out / "units").iterdir()}
    again = grid.run(_spec(models), out, quiet=True)
    assert again["computed"] == 0 and again["reused"] == 9
    changed = grid.run(_spec(models, options={"weight": {"max_iter": 3}}), out, quiet=True)
    assert changed["computed"] == 3 and changed["reused"] == 6
    records = _records(out)
    new = {r["key"] for r in records if r["method"] == "weight"}
    assert not new & set(k[:-5] for k in stamps)  # the weight units have new keys...
    for r in records:
        if r["method"] != "weight":  # ...and no other unit file was rewritten
            assert (out / "units" / f"{r['key']}.json").stat().st_mtime_ns == stamps[f"{r['key']}.json"]
    forced = grid.run(_spec(models), out, quiet=True, resume=False)
    assert forced["computed"] == 9
    _assert_same(_records(out), _records(reference), rel=1e-9)


# ---------------------------------------------------------------- subprocesses
def _grid_cmd(spec_path: Path, out: Path) -> list[str]:
    return ["-m", "lmc_fast.cli", "grid", str(spec_path), "--out", str(out), "--quiet"]


def test_sigkill_then_resume(models, reference, tmp_path):
    spec_path = _toml(_spec(models), tmp_path / "g.toml")
    out = tmp_path / "g"
    proc = subprocess.Popen([sys.executable, *_grid_cmd(spec_path, out)], cwd=ROOT, env=_env())
    units = out / "units"
    deadline = time.monotonic() + 120
    while not (units.is_dir() and any(p.suffix == ".json" for p in units.iterdir())):
        assert proc.poll() is None, "the grid ended before writing a unit"
        assert time.monotonic() < deadline
        time.sleep(0.002)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    done = len(list(units.glob("*.json")))
    assert 1 <= done < 9 and not (out / "results.jsonl").exists()
    subprocess.run([sys.executable, *_grid_cmd(spec_path, out)], cwd=ROOT, env=_env(), check=True)
    assert len(list(units.glob("*.json"))) == 9
    _assert_same(_records(out), _records(reference), rel=1e-9)


def test_two_gloo_ranks_equal_one_process(models, reference, tmp_path):
    spec_path = _toml(_spec(models), tmp_path / "g.toml")
    out = tmp_path / "g"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           *_grid_cmd(spec_path, out)]
    done = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    records = _records(out)
    assert sorted({r["rank"] for r in records}) == [0, 1]
    _assert_same(records, _records(reference), rel=1e-6)


def test_recipe_models_are_trained_once_and_profile(tmp_path):
    spec = {"models": {"recipe": "vit-digits", "seeds": [0, 1], "steps": 2},
            "data": {"max_batches": 1}, "grid": {"methods": ["none", "weight"], "lambdas": 2}}
    out = tmp_path / "g"
    grid.run(spec, out, quiet=True, profile=tmp_path / "trace")
    weights = out / "models" / "seed1" / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    assert [p.name for p in (tmp_path / "trace").iterdir()] == ["unit1-weight.json"]
    again = grid.run(spec, out, quiet=True)
    assert again["computed"] == 0 and weights.stat().st_mtime_ns == stamp  # cached model, finished units
    spec["models"]["steps"] = 3  # other training: other weights, so every unit is new
    assert grid.run(spec, out, quiet=True)["computed"] == 2 and weights.stat().st_mtime_ns != stamp


SHARDED_SWEEP = """
import json, sys
import torch
import torch.distributed as dist
import lmc_fast as lf
from lmc_fast.data import load_digits, loader
from lmc_fast.io import load_model
from lmc_fast.sweep import metrics

torch.set_num_threads(1)
a, b, c = (load_model(p) for p in sys.argv[1:4])
test = list(loader(load_digits("test"), 64))[:5]  # 5 batches: ranks get 3 and 2
seen = []  # batch sizes this process evaluated (per mixture)
add = metrics.MetricSums.add
metrics.MetricSums.add = lambda self, logits, targets: (seen.append(len(targets)), add(self, logits, targets))[1]
sharded = sys.argv[5] == "sharded"
# distributed=True joins torchrun's group; the simplex then shards by default (an initialised group)
res = lf.barrier(a, b, test, lambdas=5, space="raw", distributed=True if sharded else None)
sim = lf.simplex([a, b, c], test, n=3, space="raw")
rank = dist.get_rank() if sharded else 0
with open(f"{sys.argv[4]}.{rank}", "w") as f:
    json.dump({"barrier": res.to_dict(), "simplex": sim, "seen": len(seen), "world": 2 if sharded else 1}, f)
"""


def test_barrier_and_simplex_sharded_over_two_gloo_ranks(models, tmp_path):
    script = tmp_path / "sweep.py"
    script.write_text(SHARDED_SWEEP)
    subprocess.run([sys.executable, str(script), *models, str(tmp_path / "one"), "local"], cwd=ROOT, env=_env(),
                   check=True)
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(script), *models, str(tmp_path / "two"), "sharded"], cwd=ROOT, env=_env(),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    r1 = json.loads((tmp_path / "one.0").read_text())
    ranks = [json.loads((tmp_path / f"two.{r}").read_text()) for r in range(2)]
    # (5 barrier points + 3 models + centroid + 3 samples) x batches: 3 batches on rank 0, 2 on rank 1
    assert [r["seen"] for r in ranks] == [12 * 3, 12 * 2] and r1["seen"] == 12 * 5
    for r2 in ranks:  # every rank returns the whole result
        for key in ("loss", "acc", "ece", "signed"):
            assert r2["barrier"][key] == pytest.approx(r1["barrier"][key], rel=1e-6, abs=1e-12)
        for d1, d2 in zip(r1["barrier"]["reliability"], r2["barrier"]["reliability"]):  # bins all-reduced
            assert d2["n"] == d1["n"] and [c is None for c in d2["conf"]] == [c is None for c in d1["conf"]]
            for key in ("conf", "acc"):
                assert [v or 0.0 for v in d2[key]] == pytest.approx([v or 0.0 for v in d1[key]], rel=1e-6, abs=1e-12)
        for p1, p2 in zip(r1["simplex"]["samples"] + r1["simplex"]["models"],
                          r2["simplex"]["samples"] + r2["simplex"]["models"]):
            assert p2["loss"] == pytest.approx(p1["loss"], rel=1e-6)
            assert p2["acc"] == pytest.approx(p1["acc"], rel=1e-6)


def test_sharded_batches_cover_the_data_once():
    from lmc_fast.sweep.shard import shard_of, sharded

    data = list(range(7))
    parts = [list(sharded(data, 5, (r, 2))) for r in range(2)]
    assert parts == [[0, 2, 4], [1, 3]] and list(sharded(data, None, None)) == data
    assert shard_of(None) is None and shard_of(False) is None
    with pytest.raises(ValueError, match="distributed=True needs a process group"):
        env = os.environ.pop("WORLD_SIZE", None)
        try:
            shard_of(True)
        finally:
            if env is not None:
                os.environ["WORLD_SIZE"] = env


def test_cli_errors_are_one_line_exit_2(tmp_path, capsys, models):
    from lmc_fast.cli import main

    bad = _spec(["a", "b", "c"])
    bad["grid"]["pairs"] = [[0, 7]]
    assert main(["grid", str(_toml(bad, tmp_path / "bad.toml")), "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err.strip() == "lmc-fast: error: grid.pairs: index 7 out of range for 3 models"
    wrong_data = _spec(models)
    wrong_data["data"]["spec"] = "nodata"
    assert main(["grid", str(_toml(wrong_data, tmp_path / "d.toml")), "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err.strip().startswith("lmc-fast: error: data.spec: unknown --data 'nodata'")


def test_killed_learned_unit_resumes_from_its_checkpoint(models, tmp_path, monkeypatch):
    """A learned unit checkpoints its solve; a rerun after a kill continues from it, ends with the
    uninterrupted run's numbers, and removes the checkpoint once the alignment is stored."""
    from lmc_fast.match import learned

    spec = _spec(models[:2], methods=["learned"], options={"learned": {"steps": 8, "eval_every": 2}})
    whole = grid.run(spec, tmp_path / "whole", quiet=True)["records"]
    out = tmp_path / "killed"
    real, calls = learned.sample_weights, []

    def dying(*args, **kw):
        calls.append(1)
        if len(calls) > 5:  # checkpoints at steps 2 and 4, killed during step 6
            raise KeyboardInterrupt("killed")
        return real(*args, **kw)

    with monkeypatch.context() as m:
        m.setattr(learned, "sample_weights", dying)
        with pytest.raises(KeyboardInterrupt):
            grid.run(spec, out, quiet=True)
    assert [p.name.endswith(".learned.ckpt") for p in (out / "alignments").iterdir()] == [True]
    calls.clear()
    monkeypatch.setattr(learned, "sample_weights", lambda *a, **k: calls.append(1) or real(*a, **k))
    resumed = grid.run(spec, out, quiet=True)["records"]
    assert len(calls) == 8 - 4
    assert not list((out / "alignments").glob("*.ckpt"))
    drop = ("seconds", "steps_per_second")
    assert resumed[0]["barrier"] == whole[0]["barrier"]
    assert {k: v for k, v in resumed[0]["curve"].items() if k not in drop} == \
        {k: v for k, v in whole[0]["curve"].items() if k not in drop}
    assert {k: v for k, v in resumed[0]["info"].items() if k not in drop} == \
        {k: v for k, v in whole[0]["info"].items() if k not in drop}


def test_variants_and_simplex_groups(models, tmp_path):
    """A variant is its own column running another method's options; a simplex group reuses the pair's
    alignment of the same column and reports the centroid; both resume like pair units."""
    spec = _spec(models, methods=["none", "weight", "weight-3"],
                 options={"weight-3": {"method": "weight", "max_iter": 3}})
    spec["grid"]["pairs"] = [[0, 1]]
    spec["simplex"] = {"groups": [[0, 1, 2]], "methods": ["none", "weight"], "samples": 3}
    out = tmp_path / "g"
    first = grid.run(spec, out, quiet=True)
    recs = first["records"]
    assert [(r.get("kind", "pair"), r["method"]) for r in recs] == [
        ("pair", "none"), ("pair", "weight"), ("pair", "weight-3"), ("simplex", "none"), ("simplex", "weight")]
    weight, simplex_weight = recs[1], recs[4]
    assert weight["alignment"] in simplex_weight["alignments"]  # the pair's 1 -> 0 alignment, reused
    assert simplex_weight["alignment_reused"] == [True, False]
    assert simplex_weight["models"] == [0, 1, 2] and len(simplex_weight["simplex"]["samples"]) == 3
    own = [m["loss"] for m in simplex_weight["simplex"]["models"]]
    assert simplex_weight["centroid"] == pytest.approx(simplex_weight["centroid_loss"] - sum(own) / 3, abs=1e-9)
    # no alignment at the centroid of raw parameters: the mean of raw weights, as lf.simplex computes it
    import lmc_fast as lf
    from lmc_fast.io import load_model
    from lmc_fast.sweep.batches import reiterable

    runner_batches = [(x, y) for x, y in reiterable(grid.runner.Runner(parse_spec(spec), out, _one_rank(),
                                                                       True, print).eval_batches())]
    direct = lf.simplex([load_model(p) for p in models], runner_batches, n=3, space="raw")
    assert recs[3]["centroid"] == pytest.approx(direct["centroid"]["excess"], rel=1e-9)
    summary = (out / "summary.md").read_text()
    assert "## Simplex" in summary and "| weight | 1 |" in summary
    assert (out / "summary_simplex.csv").exists()
    again = grid.run(spec, out, quiet=True)
    assert again["computed"] == 0 and again["reused"] == 5


def _one_rank():
    from lmc_fast.grid.dist import Group

    return Group(rank=0, world=1, device="cpu")


@pytest.mark.parametrize("patch, message", [
    (lambda s: s["methods"].update({"w2": {"max_iter": 3}}), r"methods\.w2: unknown method"),
    (lambda s: s["methods"].update({"w2": {"method": "magic"}}), r"methods\.w2\.method: unknown method 'magic'"),
    (lambda s: s["methods"].update({"weight": {"method": "learned"}}), r"methods\.weight\.method: only a variant"),
    (lambda s: s["methods"].update({"w2": {"method": "weight", "steps": 3}}), r"methods\.w2\.steps: unknown option; weight takes"),
    (lambda s: s.update(simplex={"groups": [[0, 0, 1]]}), r"simplex\.groups: group \[0, 0, 1\] lists a model twice"),
    (lambda s: s.update(simplex={"groups": [[0, 5, 1]]}), r"simplex\.groups: index 5 out of range for 3 models"),
    (lambda s: s.update(simplex={"groups": [[0, 1, 2]], "methods": ["w9"]}), r"simplex\.methods: unknown method 'w9'"),
    (lambda s: s.update(simplex={"groups": [[0, 1, 2]], "alpha": 0}), r"simplex\.alpha: must be a finite number > 0"),
    (lambda s: s.update(simplex={"groups": [[0, 1, 2]], "colour": 1}), r"simplex\.colour: unknown key"),
])
def test_bad_variants_and_groups_are_named(patch, message):
    spec = _spec(["a", "b", "c"])
    patch(spec)
    with pytest.raises(ValueError, match=message):
        parse_spec(spec)
