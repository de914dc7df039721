"""The study grids that bench/learned_subsets.py and bench/learned_budget.py derive from Table 1's specs
are valid grid specs that change only what the study varies (TOML written, read back, parsed)."""
import sys
import tomllib
from pathlib import Path

import pytest

from lmc_fast.grid.spec import parse_spec

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))
import learned_budget  # noqa: E402
import learned_subsets  # noqa: E402

SETTINGS = sorted(learned_subsets.SETTINGS)


def _table1(setting: str) -> dict:
    return tomllib.loads((BENCH / "grids" / f"table1_{setting}.toml").read_text())


@pytest.mark.parametrize("setting", SETTINGS)
def test_subset_grid_keeps_table1_models_data_and_learned_settings(setting):
    spec = learned_subsets.derived_spec(setting)
    back = tomllib.loads(learned_subsets.to_toml(spec))
    assert back == spec
    grid = parse_spec(back)
    t1 = _table1(setting)
    assert back["data"] == t1["data"] and back["models"] == t1["models"] and "simplex" not in back
    assert list(grid.methods) == learned_subsets.METHODS
    learned = {k: v for k, v in t1["methods"]["learned"].items()}
    for name, mode in learned_subsets.SUBSETS.items():
        opts = {k: v for k, v in back["methods"][name].items() if k not in ("method", "learn")}
        assert opts == learned and back["methods"][name]["learn"] == mode, name
    assert back["methods"][learned_subsets.BOTH]["sides"] == "both"
    assert back["methods"][learned_subsets.DOUBLE_LR]["lr"] == 2 * learned["lr"]
    spec["grid"]["methods"].pop()  # trimming one derived spec leaves the next whole
    assert learned_subsets.derived_spec(setting)["grid"]["methods"] == learned_subsets.METHODS


@pytest.mark.parametrize("setting", SETTINGS)
def test_budget_grid_varies_steps_and_keeps_the_training_examples(setting):
    t1 = _table1(setting)
    spec = learned_budget.derived_spec(setting, [100, 1000], batch=16, lr=0.02)
    back = tomllib.loads(learned_budget.to_toml(spec))
    parse_spec(back)
    assert list(back["methods"]) == ["learned-100-b16-lr0p02", "learned-1000-b16-lr0p02"]
    assert [m["steps"] for m in back["methods"].values()] == [100, 1000]
    assert all(m["lr"] == 0.02 and m["eval_every"] == max(10, m["steps"] // 10) for m in back["methods"].values())
    old_batch = t1["data"].get("match_batch_size", 64)
    if "match_max_batches" in t1["data"]:  # the same examples in smaller batches
        assert back["data"]["match_max_batches"] * 16 == t1["data"]["match_max_batches"] * old_batch
    plain = learned_budget.derived_spec(setting, [300], None, None)
    assert plain["data"] == t1["data"] and plain["methods"]["learned-300"]["lr"] == t1["methods"]["learned"]["lr"]


@pytest.mark.parametrize("setting", SETTINGS)
def test_budget_grid_sets_any_learned_option_and_names_what_it_changed(setting):
    """--set KEY=VALUE: the option in every budget's run, in its name, and reported as the change from
    Table 1's learned column, with each pair compared against the unchanged run of the same steps."""
    assert learned_budget.parse_sets(["augment=mixup", "clip=1", "x=true"]) == {"augment": "mixup", "clip": 1, "x": True}
    sets = learned_budget.parse_sets(["temperature=2.5", "warmup=0.1", "lambdas_per_step=4"])
    assert sets == {"temperature": 2.5, "warmup": 0.1, "lambdas_per_step": 4}
    spec = learned_budget.derived_spec(setting, [300], None, 0.03, sets)
    back = tomllib.loads(learned_budget.to_toml(spec))
    parse_spec(back)  # a valid grid: every option known to the method, checked by its rule
    (name, opts), = back["methods"].items()
    assert name == "learned-300-lr0p03-temperature2p5-warmup0p1-lambdas_per_step4"
    assert opts["temperature"] == 2.5 and opts["warmup"] == 0.1 and opts["lambdas_per_step"] == 4
    record = {"method": name, "options": {k: v for k, v in opts.items() if k != "method"}}
    assert learned_budget.changed_settings(setting, record) == {"lr": 0.03, **sets}
    plain = {"method": "learned-300-b16", "options": dict(_table1(setting)["methods"]["learned"], steps=300)}
    assert learned_budget.changed_settings(setting, plain) == {"match_batch_size": 16}
    plain["method"] = "learned-300"
    assert learned_budget.changed_settings(setting, plain) == {}
    # a column is its settings, however named: every labels-loop setting given without the preset's name
    # (the default of another day) is the same change as the preset named
    loop = {"preset": "labels-loop", "steps": 300}
    spelled = {k: v for k, v in learned_budget.effective(loop).items() if k != "patience"}
    named = learned_budget.changed_settings(setting, {"method": "learned-300", "options": loop})
    assert learned_budget.changed_settings(setting, {"method": "learned-300", "options": spelled}) == named
    assert named["lambdas_per_step"] == 1 and named["weight_decay"] == 0.01 and named["target"] == "labels"
    assert "preset" not in named
    # settings left to the default, on which the presets differ: reported as left to it
    assert learned_budget.changed_settings(setting, {"method": "learned-300", "options": {"steps": 300}})["target"] is None
    ref = {"steps": 300, "changed": {}, "pairs": [[0, 1], [2, 3], [4, 5]], "barrier_per_pair": [0.1, 0.2, 0.3]}
    row = {"steps": 300, "changed": sets, "pairs": [[0, 1], [2, 3], [6, 7]], "barrier_per_pair": [0.05, 0.3, 0.0]}
    rows = {"a": ref, "b": row}
    assert learned_budget.lower_than_table1(rows, row) == "1/2"  # only the pairs both runs have
    assert learned_budget.lower_than_table1(rows, ref) == ""
    # a run on other models (a grid retrained on another CPU) is not compared with the reference's pairs
    other = {**row, "models": [["x", "y"]] * 3}
    ref_here = {**ref, "models": [["a", "b"], ["c", "d"], ["e", "f"]]}
    assert learned_budget.models_tag(other) != learned_budget.models_tag(ref_here)
    assert learned_budget.lower_than_table1({"a": ref_here, "b": other}, other) == ""
    same = {**row, "models": [["a", "b"], ["c", "d"], ["g", "h"]]}
    assert learned_budget.lower_than_table1({"a": ref_here, "b": same}, same) == "1/2"
    # a method name two grids give stays two rows, the second named by its folder
    merged: dict = {}
    learned_budget.merge_rows(merged, {"learned-600": ref_here}, Path("grids/xeon"))
    learned_budget.merge_rows(merged, {"learned-600": other}, Path("grids/epyc"))
    assert merged == {"learned-600": ref_here, "learned-600 @epyc": other}
    with pytest.raises(SystemExit, match="KEY=VALUE"):
        learned_budget.parse_sets(["augment"])


def test_authors_code_reads_pairs_and_exports_our_gpt2_exactly(tmp_path):
    """bench/authors_code.py: --pairs parsed or refused in one line; our GPT-2 written as a Hugging Face
    folder that GPT2LMHeadModel reads back with our logits (what their code is given)."""
    import torch
    import transformers

    import authors_code
    from lmc_fast.models import GPT2, GPT2Config

    assert authors_code.parse_pairs("all", 10) == [(0, 1), (2, 3), (4, 5), (6, 7), (8, 9)]
    assert authors_code.parse_pairs("0,1 4,2", 10) == [(0, 1), (4, 2)]
    for bad in ("0", "1,1", "0,10", "a,b", " "):
        with pytest.raises(SystemExit, match="--pairs"):
            authors_code.parse_pairs(bad, 10)
    torch.manual_seed(0)
    model = GPT2(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=32, block_size=8)).eval()
    with torch.no_grad():
        for p in model.parameters():  # norms and biases away from their initial values too
            p.add_(0.1 * torch.randn_like(p))
    authors_code.export(model, tmp_path / "hf")
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf", local_files_only=True).eval()
    x = torch.randint(0, 32, (3, 8))
    with torch.no_grad():
        assert (hf(input_ids=x).logits - model(x)).abs().max() < authors_code.EXPORT_TOL


def test_authors_code_summarises_only_the_columns_every_pair_has():
    """A column added later (--columns) to some pairs only is left out of the medians and ratios, not
    summarised over the pairs that have it."""
    import authors_code

    def col(barrier, seconds):
        return {"barrier": barrier, "seconds": seconds}

    full = {"theirs_learned": col(0.01, 100.0), "ours_paper": col(0.02, 50.0), "ours_their_loop": col(0.005, 25.0),
            "ours_labels": col(0.008, 40.0)}
    part = {"theirs_learned": col(0.03, 100.0), "ours_paper": col(0.03, 200.0)}
    records = [{"columns": c, "ratios": authors_code.ratios(c)} for c in (full, part)]
    assert records[0]["ratios"]["their_loop"] == {"barrier": 0.5, "seconds": 0.25}
    assert records[0]["ratios"]["learned_labels"] == {"barrier": 0.8, "seconds": 0.4}
    assert "their_loop" not in records[1]["ratios"] and "learned_labels" not in records[1]["ratios"]
    s = authors_code.summary(records)
    assert set(s["columns"]) == {"theirs_learned", "ours_paper"} and set(s["ratios"]) == {"learned_paper"}
    assert s["ratios"]["learned_paper"]["barrier"]["values"] == [2.0, 1.0]


def test_gemm_meter_counts_the_flops_it_times_and_restores_the_library():
    """bench/bench_stream_scale.py's GemmMeter: flops counted from the operands' shapes (a correlation term
    (n x m) @ (m x n) is 2 n n m; a rotation (n x n) @ (n x m) is 2 n n m), results unchanged, and the
    wrapped functions put back on exit (also when the body raises)."""
    from types import SimpleNamespace

    import torch

    import bench_stream_scale
    from lmc_fast.match import solve
    from lmc_fast.match.kinds import heads
    from lmc_fast.symmetry.groups import Orthogonal

    originals = (solve.axes_correlation, heads.correlation, Orthogonal.apply)
    g = SimpleNamespace(axes=(SimpleNamespace(param="w", axis=0), SimpleNamespace(param="u", axis=1)))
    pa = {"w": torch.randn(6, 5, dtype=torch.float64), "u": torch.randn(3, 6, dtype=torch.float64)}
    pb = {k: torch.randn_like(v) for k, v in pa.items()}
    R = torch.linalg.qr(torch.randn(6, 6, dtype=torch.float64))[0]
    flat = torch.randn(6, 7, dtype=torch.float64)
    with bench_stream_scale.GemmMeter() as meter:
        C = solve.axes_correlation(g, pa, pb)
        moved = Orthogonal().apply(flat, None, None, {"matrix": R})
    assert (solve.axes_correlation, heads.correlation, Orthogonal.apply) == originals
    torch.testing.assert_close(C, pa["w"] @ pb["w"].T + pa["u"].T @ pb["u"], rtol=0, atol=1e-12)
    torch.testing.assert_close(moved, R @ flat, rtol=0, atol=1e-12)
    parts = meter.parts
    assert parts["correlation"]["calls"] == 1 and parts["rotation"]["calls"] == 1 and parts["heads"]["calls"] == 0
    assert parts["correlation"]["gflop"] * 1e9 == pytest.approx(2 * 6 * 6 * 5 + 2 * 6 * 6 * 3)
    assert parts["rotation"]["gflop"] * 1e9 == pytest.approx(2 * 6 * 6 * 7)
    rec = meter.record(peak=1.0, total_seconds=1.0)
    assert rec["all"]["gflop"] == pytest.approx(parts["correlation"]["gflop"] + parts["rotation"]["gflop"])
    with pytest.raises(RuntimeError), bench_stream_scale.GemmMeter():
        raise RuntimeError("the body failed")
    assert (solve.axes_correlation, heads.correlation, Orthogonal.apply) == originals


def test_preset_rules_scores_each_default_by_its_regret(tmp_path):
    """Planted grids: labels-loop is lowest on digits and GPT-2, paper on BERT; distill-loop ran on digits only, so
    "always distill-loop" is not scored. The library's rule picks distill-loop on the memorised digits pair (0.004
    over labels-loop) and labels-loop elsewhere (0.05 over paper on BERT); regrets are the exact differences; the
    rule follows each pair's recorded training loss. Grids with other models in one setting, or pairs without a
    recorded loss, are refused."""
    import json
    import subprocess

    def grid(folder, barriers, prints=("a", "b"), loss=None):
        folder = tmp_path / "results" / folder
        folder.mkdir(parents=True, exist_ok=True)
        info = {} if loss is None else {"end_models_training_loss": loss}
        recs = [{"method": m, "pair": [0, 1], "barrier": b, "seconds": {"solve": 10.0}, "info": info}
                for m, b in barriers.items()]
        (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
        (folder / "grid.json").write_text(json.dumps({"fingerprints": list(prints)}))

    grid("table1/digits", {"learned": 0.01, "learned-paper": 0.05, "weight": 1.0}, loss=7e-4)
    grid("learned_settings/digits_labels", {"learned-labels": 0.04, "none": 2.0})
    grid("learned_settings/digits_labels_loop", {"learned-labels-loop": 0.008, "learned-distill-loop": 0.012})
    grid("learned_settings/shakespeare_equal_seconds", {"learned-300": 0.03, "learned-paper-300": 0.02}, loss=2.5)
    grid("learned_settings/shakespeare_presets_parts", {"learned-300-targetlabels": 0.015})
    grid("learned_settings/shakespeare_labels_loop", {"learned-labels-loop": 0.012})
    grid("learned_settings/bert_presets", {"learned": 0.3, "learned-labels": 0.2, "learned-paper": 0.1}, loss=3.1)
    grid("learned_settings/bert_labels_loop", {"learned-labels-loop": 0.15})

    def rules():
        return subprocess.run([sys.executable, str(BENCH / "preset_rules.py"), "--results", str(tmp_path / "results"),
                               "--out", str(tmp_path / "rules")], capture_output=True, text=True)

    assert rules().returncode == 0
    record = json.loads((tmp_path / "rules.json").read_text())
    c = record["candidates"]
    assert c["always distill"]["pairs_lost"] == 3 and c["always distill"]["worst_absolute"] == pytest.approx(0.2)
    assert c["always distill"]["worst_relative"] == pytest.approx(2.0)
    assert c["always paper"]["worst_absolute"] == pytest.approx(0.042) and c["always paper"]["worst_relative"] == pytest.approx(5.25)
    assert c["always paper"]["pairs_lost"] == 2
    assert c["always labels"]["pairs_lost"] == 3 and c["always labels"]["worst_relative"] == pytest.approx(4.0)
    assert c["always labels-loop"]["pairs_lost"] == 1 and c["always labels-loop"]["worst_absolute"] == pytest.approx(0.05)
    assert "always distill-loop" not in c and "Not scored (their preset did not run on every pair): always distill-loop" \
        in (tmp_path / "rules.md").read_text()
    assert c["library rule"]["pairs_lost"] == 2 and c["library rule"]["worst_absolute"] == pytest.approx(0.05)
    assert c["library rule"]["mean_absolute"] == pytest.approx(0.054 / 3)
    assert record["equal_seconds"]["distill_lower"] == {"learned-300": 0}

    # the rule reads each pair's recorded training loss: digits models not memorised -> labels-loop there
    grid("table1/digits", {"learned": 0.01, "learned-paper": 0.05, "weight": 1.0}, loss=0.5)
    assert rules().returncode == 0
    c = json.loads((tmp_path / "rules.json").read_text())["candidates"]
    assert c["library rule"]["pairs_lost"] == 1 and c["library rule"]["mean_absolute"] == pytest.approx(0.05 / 3)
    assert c["former rule"]["pairs_lost"] == 3  # labels everywhere: 0.032, 0.003 and 0.1 over the lowest

    # a lowest barrier of 0 has no relative regret: left out of the relative columns, and counted
    grid("learned_settings/digits_labels_loop", {"learned-labels-loop": 0.0, "learned-distill-loop": 0.012})
    assert rules().returncode == 0
    c = json.loads((tmp_path / "rules.json").read_text())["candidates"]
    assert c["always distill"]["mean_relative"] == pytest.approx(1.75) and c["always distill"]["worst_relative"] == pytest.approx(2.0)
    assert "not where the lowest is 0: 1 pair)" in (tmp_path / "rules.md").read_text()

    grid("learned_settings/llama_labels", {"learned-labels": 0.1}, prints=("c", "d"))
    grid("table1/llama", {"learned": 0.1, "learned-paper": 0.2})
    refused = rules()
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert "llama_labels: holds other models" in refused.stderr.strip().splitlines()[-1]
    grid("learned_settings/llama_labels", {"learned-labels": 0.1})  # the same models, but no loss recorded
    refused = rules()
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert "no end_models_training_loss" in refused.stderr.strip().splitlines()[-1]


def test_table1_borrows_a_column_only_with_equal_unit_keys(tmp_path, monkeypatch):
    """Table 1's learned-loop column may come from another committed grid: taken where that grid's column has
    Table 1's unit key (same method, options, preset settings, data), marked where its models differ, refused
    (one line) where its settings differ."""
    import json
    import shutil

    import table1_summary as t1

    grids, results = tmp_path / "grids", tmp_path / "results"
    grids.mkdir()
    shutil.copy(BENCH / "grids" / "table1_digits.toml", grids)
    source = results / "study"
    source.mkdir(parents=True)
    study = (BENCH / "results" / "learned_settings" / "digits_labels_loop" / "spec.toml").read_text()
    (source / "spec.toml").write_text(study)
    pairs = [[0, 1], [2, 3]]
    (source / "results.jsonl").write_text("".join(
        json.dumps({"method": m, "pair": p, "barrier": b, "acc_mid": 0.9, "seconds": {"solve": 5.0}, "options": {}})
        + "\n" for p, b in zip(pairs, (0.01, 0.03)) for m in ("learned-distill-loop", "learned-labels-loop")))
    table1 = tmp_path / "table1"
    table1.mkdir()
    prints = ["f0", "f1", "f2", "f3"]
    (table1 / "grid.json").write_text(json.dumps({"pairs": pairs, "fingerprints": prints}))
    monkeypatch.setattr(t1, "GRIDS", grids)
    monkeypatch.setattr(t1, "RESULTS", results)
    monkeypatch.setattr(t1, "BORROWED", {"learned-loop": {"table1_digits": ("study", "learned-distill-loop")}})

    def borrowed(study_prints):
        (source / "grid.json").write_text(json.dumps({"pairs": pairs, "fingerprints": study_prints}))
        table = {"methods": {}, "pairs": pairs}
        t1.borrow("table1_digits", table1, table, False)
        return table

    row = borrowed(prints)["methods"]["learned-loop"]
    assert row["barrier"] == {"n": 2, "median": 0.02, "min": 0.01, "max": 0.03} and row["same_models"]
    other = borrowed(["f0", "f1", "f2", "g3"])
    assert other["methods"]["learned-loop"]["same_models"] is False
    assert "0.020 [0.010, 0.030] \u2020" in t1.markdown({"table1_digits": {**other, "simplex": {},
                                                                           "end_models_acc": None}})
    # a column the Table 1 grid computed itself is its own
    own = {"methods": {"learned-loop": {"barrier": None}}, "pairs": pairs}
    t1.borrow("table1_digits", table1, own, False)
    assert own["methods"]["learned-loop"] == {"barrier": None}
    # other settings (validation every 100 steps, not 200): other units, refused in one line
    (source / "spec.toml").write_text(study.replace("eval_every = 200", "eval_every = 100"))
    with pytest.raises(SystemExit, match="is not Table 1's learned-loop of table1_digits"):
        borrowed(prints)


def test_stream_bench_joins_ranks_by_their_slowest_and_largest():
    """bench/bench_stream_scale.py under torchrun: a phase both ranks ran takes the slower rank's seconds and
    the larger peak; a phase one rank ran alone (apply on rank 0, merge on rank 1) is kept as it is; the
    run's peak is the largest process's, generation not counted. The sweep's token batches: `tokens` in all,
    next-token targets (the inputs themselves), the same on every call."""
    import torch

    import bench_stream_scale as b

    r0 = {"generate_a": {"seconds": 9.0, "peak_rss_bytes": 99}, "match": {"seconds": 10.0, "peak_rss_bytes": 5},
          "apply": {"seconds": 3.0, "peak_rss_bytes": 4}}
    r1 = {"match": {"seconds": 12.0, "peak_rss_bytes": 4}, "merge": {"seconds": 2.0, "peak_rss_bytes": 7}}
    out = b.join_ranks([(r0, {"sweeps": 1}), (r1, {"sweeps": 1})])
    assert out["phases"]["match"] == {"seconds": 12.0, "peak_rss_bytes": 5}
    assert out["phases"]["apply"] == r0["apply"] and out["phases"]["merge"] == r1["merge"]
    assert out["peak_rss_bytes"] == 7 and out["rank_phases"] == [r0, r1] and len(out["rank_match"]) == 2
    one = b.join_ranks([(r0, None)])
    assert one["phases"] == r0 and one["peak_rss_bytes"] == 5 and "rank_phases" not in one
    batches = b.token_batches(vocab=50, tokens=1024, seq_len=256)
    assert len(batches) == 4 and all(x.shape == (1, 256) and torch.equal(x, y) for x, y in batches)
    assert sum(x.numel() for x, _ in batches) == 1024 and int(max(x.max() for x, _ in batches)) < 50
    assert all(torch.equal(x, x2) for (x, _), (x2, _) in zip(batches, b.token_batches(50, 1024, 256)))


def test_stream_bench_phases_follow_the_flags_and_refuse_what_cannot_run():
    """bench/bench_stream_scale.py's phases: by default what the flags ask for, in their order; `--only`
    (a run split over sessions) runs just those, and refuses a barrier without tokens or a match with a
    random element, each in one line."""
    import pytest

    import bench_stream_scale as b

    def phases(*argv):
        import argparse

        ap = argparse.ArgumentParser()
        for flag in ("--planted", "--random-element", "--writes-only"):
            ap.add_argument(flag, action="store_true")
        ap.add_argument("--barrier-tokens", type=int, default=0)
        ap.add_argument("--only", action="append", choices=b.PHASES, default=None)
        return b._phases(ap.parse_args(argv))

    assert phases() == ["match", "write"]
    assert phases("--planted", "--barrier-tokens", "8") == ["match", "write", "barrier", "planted"]
    assert phases("--random-element", "--barrier-tokens", "8") == ["write", "barrier"]
    assert phases("--writes-only") == ["write"]
    assert phases("--only", "planted", "--only", "match") == ["match", "planted"]
    for bad in (("--only", "barrier"), ("--random-element", "--only", "match"), ("--writes-only", "--only", "barrier")):
        with pytest.raises(SystemExit, match="--"):
            phases(*bad, "--barrier-tokens", "8" if bad[0] == "--writes-only" else "0")
