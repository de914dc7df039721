"""lf.merge_many on checkpoint paths (match/many_streamed.py): the alignments of the in-memory merge_many, in
both modes, for every model of the zoo; aligned copies and the merge written from them equal the in-memory
ones; `lmc-fast merge --stream` writes what the in-memory merge writes; bad calls are refused in one line
before anything is written."""
import pytest
import torch

import lmc_fast as lf
from lmc_fast.cli import main
from lmc_fast.io import load_model, save_model
from lmc_fast.models.adapters import standard_params
from lmc_fast.stream import pieces as stream_pieces
from lmc_fast.stream.paths import merge_paths
from zoo import KINDS, make_batches, make_model


@pytest.fixture
def tiny_row_blocks(monkeypatch):
    """Row blocks of 3 rows of 32 float64 values: the embedding and head come in many blocks."""
    monkeypatch.setattr(stream_pieces, "ROW_BLOCK_BYTES", 3 * 32 * 8)


def _saved(tmp_path, kind, n=3, **kw):
    models = [make_model(kind, s, **kw) for s in range(n)]
    paths = [tmp_path / f"{kind}-{s}" for s in range(n)]
    for m, p in zip(models, paths):
        save_model(m, p)
    return models, paths


def _assert_same(mem, streamed, tol=1e-10):
    assert len(mem) == len(streamed)
    for al1, al2 in zip(mem, streamed):
        assert al1.spec.space == al2.spec.space
        for n, el in al1.elements.items():
            for k, t in el.items():
                u = al2.elements[n][k]
                if t.is_floating_point():
                    assert float((t - u).abs().max()) < tol, (n, k)
                else:
                    assert torch.equal(t, u), (n, k)  # permutations exactly
        assert al1.info["merge_rounds"] == al2.info["merge_rounds"]


@pytest.mark.parametrize("kind", KINDS)
def test_streamed_mean_mode_equals_in_memory(tmp_path, tiny_row_blocks, kind):
    """A round of MergeMany against the mean of the others, streamed: the same elements (the round starts from
    the streamed reference alignments, so both modes are covered; more rounds: the tests below)."""
    models, paths = _saved(tmp_path, kind)
    _, mem = lf.merge_many(models, "weight", rounds=1, return_alignments=True)
    streamed = lf.merge_many([str(p) for p in paths], "weight", rounds=1)  # str and Path alike
    _assert_same(mem, streamed)
    assert all(al.info["streamed"] for al in streamed) and streamed[1].info["mode"] == "mean"
    assert streamed[1].info["bytes_read"] > 0


@pytest.mark.parametrize("kind", ["llama", "bert"])
@pytest.mark.parametrize("mode", ["reference", "mean"])
def test_streamed_permutation_merge_many_equals_in_memory(tmp_path, kind, mode):
    models, paths = _saved(tmp_path, kind)
    _, mem = lf.merge_many(models, "permutation", mode=mode, return_alignments=True)
    streamed = lf.merge_many(paths, "permutation", mode=mode)
    _assert_same(mem, streamed, tol=0)
    assert streamed[0].spec.space == "raw"
    assert mode == "reference" or streamed[0].info["method"] == "permutation"


def test_streamed_reference_mode_with_activation_matching(tmp_path):
    models, paths = _saved(tmp_path, "gpt2")
    data = make_batches("gpt2", 2)
    _, mem = lf.merge_many(models, "activation", mode="reference", data=data, return_alignments=True)
    _assert_same(mem, lf.merge_many(paths, "activation", mode="reference", data=data))


@pytest.mark.parametrize("kind", ["llama", "hf_llama"])
def test_aligned_copies_and_their_merge_equal_in_memory(tmp_path, kind):
    models, paths = _saved(tmp_path, kind)
    aligned, mem = lf.merge_many(models, "weight", rounds=2, return_alignments=True)
    folders, streamed = lf.merge_many(paths, "weight", rounds=2, out=tmp_path / "out", return_alignments=True)
    _assert_same(mem, streamed)
    assert folders == [tmp_path / "out" / f"aligned_{i}" for i in range(3)]
    for want_model, folder in zip(aligned, folders):
        got_model = load_model(folder)
        assert type(got_model) is type(want_model)
        _, got = standard_params(got_model)
        _, want = standard_params(want_model)
        assert max(float((got[n] - want[n]).abs().max()) for n in want) < 1e-12
    merged = load_model(merge_paths(paths, tmp_path / "merged", streamed))
    _, got = standard_params(merged)
    _, want = standard_params(lf.interpolate(aligned, [1 / 3] * 3, space="canonical"))
    assert max(float((got[n] - want[n]).abs().max()) for n in want) < 1e-12
    # without return_alignments: the folders alone, like the models in memory
    two = lf.merge_many(paths[:2], "weight", mode="reference", out=tmp_path / "two")
    assert two == [tmp_path / "two" / f"aligned_{i}" for i in range(2)] and all(load_model(f) for f in two)


def test_float32_solve_gives_exact_group_elements(tmp_path):
    """dtype=float32 (what a 7B merge uses): the same permutations, maps snapped to exact group elements."""
    models, paths = _saved(tmp_path, "llama")
    _, mem = lf.merge_many(models, "weight", mode="reference", return_alignments=True)
    f32 = lf.merge_many(paths, "weight", mode="reference", dtype=torch.float32)
    _assert_same(mem, f32, tol=1e-4)
    assert f32[1].info["dtype"] == "float32"
    f32[1].validate()


@pytest.mark.parametrize("call, message", [
    (lambda m, p, t: lf.merge_many([m[0], p[1]]), "models in memory or checkpoint paths, not both"),
    (lambda m, p, t: lf.merge_many(m, out=t / "o"), "out, dtype and distributed are for checkpoint paths"),
    (lambda m, p, t: lf.merge_many(p, "learned", mode="reference", data=[]), "needs the models in memory"),
    (lambda m, p, t: lf.merge_many(p, "activation", data=[]), "mode='mean' needs a data-free method"),
    (lambda m, p, t: lf.merge_many(p, "activation", mode="reference", data=[], distributed=True),
     "runs in one process"),
    (lambda m, p, t: lf.merge_many(p, out=p[1]), "overlaps the input"),
    (lambda m, p, t: lf.merge_many([p[0], t / "narrow"]), "another MLP width.*pad_mlp"),
    (lambda m, p, t: lf.merge_many(p, mode="medoid"), "mode must be"),
    (lambda m, p, t: lf.merge_many(p, out=t / "file.txt"), "file.txt exists and is not a folder"),
    (lambda m, p, t: lf.merge_many(p, dtype=torch.float16), "dtype must be torch.float32 or torch.float64"),
    (lambda m, p, t: lf.merge_many([p[0], t / "nope"]), "nope: no such file or folder"),
])
def test_bad_streamed_merge_many_is_refused(tmp_path, call, message):
    models, paths = _saved(tmp_path, "llama", n=2)
    save_model(make_model("llama", 5, d_mlp=40), tmp_path / "narrow")
    (tmp_path / "file.txt").write_text("not a folder")
    before = sorted(p.name for p in tmp_path.rglob("*"))
    with pytest.raises(ValueError, match=message):
        call(models, paths, tmp_path)
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # nothing written, nothing removed


def test_cli_merge_stream_writes_the_in_memory_merge(tmp_path, capsys):
    """`lmc-fast merge --stream` (MergeMany by default, as in memory): the same aligned copies, alignments and
    merged model as `lmc-fast merge` without it."""
    _, paths = _saved(tmp_path, "llama")
    args = ["merge", *map(str, paths), "--rounds", "2", "--quiet"]
    assert main(args + ["--out", str(tmp_path / "mem")]) == 0
    assert main(args + ["--stream", "--out", str(tmp_path / "str")]) == 0
    assert "mean, streamed" in capsys.readouterr().out
    for entry in ["merged", "aligned_0", "aligned_2"]:
        _, got = standard_params(load_model(tmp_path / "str" / entry))
        _, want = standard_params(load_model(tmp_path / "mem" / entry))
        assert max(float((got[n] - want[n]).abs().max()) for n in want) < 1e-12, entry
    mem_al = lf.Alignment.load(tmp_path / "mem" / "alignment_1.safetensors")
    str_al = lf.Alignment.load(tmp_path / "str" / "alignment_1.safetensors")
    assert all(torch.equal(t, str_al.elements[n][k]) for n, el in mem_al.elements.items() for k, t in el.items()
               if not t.is_floating_point())
    import json

    summary = json.loads((tmp_path / "str" / "merge.json").read_text())
    assert (summary["mode"], summary["streamed"], summary["rounds"]) == ("mean", True, 2)


def test_cli_merge_stream_with_activation_matching(tmp_path, capsys):
    """Data-driven matching streams too (mode reference): the data the checkpoints name, or --data, picks the
    batches, and the merge equals the in-memory one's."""
    import transformers

    text = tmp_path / "t.txt"
    text.write_text("".join(f"line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(80)))
    folders = []
    for s in range(2):
        torch.manual_seed(s)
        cfg = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=256, n_positions=16)
        folders.append(str(save_model(transformers.GPT2LMHeadModel(cfg), tmp_path / f"hf{s}")))
    args = ["merge", *folders, "--method", "activation", "--data", f"text:{text}", "--max-batches", "2", "--quiet"]
    assert main(args + ["--samples", "2", "--eval-batches", "1", "--out", str(tmp_path / "mem")]) == 0
    assert main(args + ["--stream", "--out", str(tmp_path / "str")]) == 0
    assert "reference, streamed" in capsys.readouterr().out
    _, got = standard_params(load_model(tmp_path / "str" / "merged"))
    _, want = standard_params(load_model(tmp_path / "mem" / "merged"))
    assert max(float((got[n] - want[n]).abs().max()) for n in want) < 1e-5  # float32 checkpoints
    assert main(["merge", *folders, "--method", "activation", "--stream", "--mode", "mean", "--data", f"text:{text}",
                 "--out", str(tmp_path / "x")]) == 2
    assert "--mode mean needs a data-free method" in capsys.readouterr().err


def test_merge_rounds_visits_every_model_each_round_until_none_changes():
    from lmc_fast.match.merge_rounds import merge_rounds

    seen = []
    assert merge_rounds(4, 10, 0, lambda i: seen.append(i) or len(seen) <= 6) == 3  # round 2 changed two, 3 none
    assert len(seen) == 12 and all(sorted(seen[k:k + 4]) == [0, 1, 2, 3] for k in (0, 4, 8))
    assert seen[:4] != seen[4:8] or seen[4:8] != seen[8:]  # shuffled, seeded: the same order for the same seed
    again = []
    merge_rounds(4, 10, 0, lambda i: again.append(i) or len(again) <= 6)
    assert again == seen
    assert merge_rounds(3, 2, 1, lambda i: True) == 2  # stops at `rounds` while models still change
