"""Streamed checkpoints (lmc_fast.stream): matching two paths a block at a time gives the in-memory
elements; aligned and merged checkpoints written tensor by tensor equal the in-memory ones; a planted
symmetry written to disk is recovered; what cannot be streamed is refused in one line."""
import json

import pytest
import torch

import lmc_fast as lf
from lmc_fast.io import load_model, save_model
from lmc_fast.models.adapters import standard_params
from lmc_fast.stream import pieces as stream_pieces
from lmc_fast.stream.checkpoint import StreamedCheckpoint
from lmc_fast.stream.paths import apply_to_path, merge_paths
from lmc_fast.symmetry import Alignment, canonical_spec, prepare_params
from zoo import HF_FP32_INSIDE, KINDS, logits, make_batches, make_inputs, make_model, rel_err

#: the zoo's classes whose standard parameters are stored tensors (the ones the streamed reader takes)
STREAMABLE = KINDS  # every class of the zoo


@pytest.fixture
def tiny_row_blocks(monkeypatch):
    """Row blocks of 3 rows of 32 float64 values: the embedding and head come in many blocks."""
    monkeypatch.setattr(stream_pieces, "ROW_BLOCK_BYTES", 3 * 32 * 8)


def _saved(tmp_path, kind, seeds=(0, 1)):
    models = [make_model(kind, s) for s in seeds]
    paths = []
    for s, m in zip(seeds, models):
        paths.append(tmp_path / f"{kind}-{s}")
        save_model(m, paths[-1])
    return models, paths


def _max_diff(al1, al2) -> float:
    out = 0.0
    for n, el in al1.elements.items():
        for k, t in el.items():
            u = al2.elements[n][k]
            if not t.is_floating_point():
                assert torch.equal(t, u), (n, k)
            else:
                out = max(out, float((t.double() - u.double()).abs().max()))
    return out


@pytest.mark.parametrize("kind", STREAMABLE)
@pytest.mark.parametrize("method", ["weight", "permutation"])
def test_streamed_matching_equals_in_memory(tmp_path, tiny_row_blocks, kind, method):
    (a, b), (pa, pb) = _saved(tmp_path, kind)
    mem = lf.align(a, b, method)
    streamed = lf.align(str(pa), pb, method)  # str and Path alike
    assert streamed.info["streamed"] is True and streamed.info["bytes_read"] > 0
    assert _max_diff(mem, streamed) < 1e-10  # permutations equal (asserted inside)
    assert mem.info["iterations"] == streamed.info["iterations"]
    assert mem.info["objective"] == pytest.approx(streamed.info["objective"], rel=1e-12)
    assert (streamed.info["fingerprint_a"], streamed.info["fingerprint_b"]) == \
        (mem.info["fingerprint_a"], mem.info["fingerprint_b"])


@pytest.mark.parametrize("options", [{"weighting": "per_tensor"}, {"weighting": "per_tensor", "max_iter": 2, "tol": 0.0},
                                     {"token_counts": "zipf"}, {"dtype": torch.float32}])
def test_streamed_matching_options_equal_in_memory(tmp_path, tiny_row_blocks, options):
    (a, b), (pa, pb) = _saved(tmp_path, "llama")
    if options.get("token_counts") == "zipf":
        options = {"token_counts": 1.0 / torch.arange(1, 38, dtype=torch.float64)}
    mem, streamed = lf.align(a, b, "weight", **options), lf.align(pa, pb, "weight", **options)
    tol = 1e-4 if options.get("dtype") == torch.float32 else 1e-10
    assert _max_diff(mem, streamed) < tol
    assert streamed.info["token_prior"] == mem.info["token_prior"]


def test_sharded_hugging_face_folder_streams(tmp_path, tiny_row_blocks):
    a, b = make_model("hf_llama", 0), make_model("hf_llama", 1)
    pa, pb = tmp_path / "a", tmp_path / "b"
    a.save_pretrained(pa, max_shard_size="20KB")
    b.save_pretrained(pb, max_shard_size="20KB")
    assert (pa / "model.safetensors.index.json").is_file()
    assert _max_diff(lf.align(a, b, "weight"), lf.align(pa, pb, "weight")) < 1e-10


@pytest.mark.parametrize("kind", STREAMABLE)
def test_streamed_apply_and_merge_equal_in_memory(tmp_path, tiny_row_blocks, kind):
    (a, b), (pa, pb) = _saved(tmp_path, kind)
    al = lf.align(pa, pb, "weight")
    out = apply_to_path(al, pb, tmp_path / "aligned")
    aligned = load_model(out)
    assert type(aligned) is type(b)
    _, got = standard_params(aligned)
    _, want = standard_params(al.apply(b))
    assert max(float((got[n] - want[n]).abs().max()) for n in want) < 1e-12
    x = make_inputs(kind)
    assert rel_err(logits(aligned, x), logits(b, x)) < (1e-5 if kind in HF_FP32_INSIDE else 1e-10)
    merged = load_model(merge_paths([pa, pb], tmp_path / "merged", [None, al], weights=[0.25, 0.75]))
    _, got = standard_params(merged)
    _, raw_a = standard_params(a)
    ref = prepare_params(al.spec, al.spec.arch, raw_a)
    assert max(float((got[n] - (0.25 * ref[n] + 0.75 * want[n])).abs().max()) for n in want) < 1e-12


def test_planted_symmetry_written_to_disk_is_recovered(tmp_path, tiny_row_blocks):
    """B = g . A written streaming; weight matching of the two paths finds g^-1 (permutations exactly,
    maps to 1e-6) and the aligned B written streaming is A's canonical form."""
    a = make_model("llama", 5)
    pa = tmp_path / "a"
    save_model(a, pa)
    arch, _ = standard_params(a)
    truth = Alignment.random(canonical_spec(arch), seed=6)
    pb = apply_to_path(truth, pa, tmp_path / "planted")
    al = lf.align(pa, pb, "weight")
    inv = truth.inverse()
    for name, group in al.spec.groups.items():
        for key, t in al[name].items():
            if t.is_floating_point():
                assert torch.allclose(t, inv[name][key], atol=1e-6), (name, key)
            else:
                assert torch.equal(t, inv[name][key]), (name, key)
    back = load_model(apply_to_path(al, pb, tmp_path / "back"))
    _, got = standard_params(back)
    _, want = standard_params(lf.to_canonical(a))
    assert max(float((got[n] - want[n]).abs().max()) for n in want) < 1e-8


def test_hugging_face_output_keeps_its_format_sharded(tmp_path, monkeypatch):
    from lmc_fast.stream import write

    monkeypatch.setattr(write, "SHARD_BYTES", 30_000)
    (a, b), (pa, pb) = _saved(tmp_path, "hf_llama")
    al = lf.align(pa, pb, "weight")
    out = tmp_path / "out"
    apply_to_path(al, pb, out, dtype=torch.float32)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "llama"
    import transformers

    hf = transformers.AutoModelForCausalLM.from_pretrained(out)  # transformers itself reads what we wrote
    assert hf.model.layers[0].mlp.up_proj.weight.dtype == torch.float32
    x = make_inputs("hf_llama")
    assert rel_err(logits(hf.double(), x), logits(b, x)) < 1e-5


def test_tied_head_comes_out_untied(tmp_path):
    a = make_model("gpt2", 0)
    assert a.config.tie_word_embeddings
    pa = tmp_path / "a"
    save_model(a, pa)
    truth = Alignment.random(canonical_spec(standard_params(a)[0]), seed=1)
    out = load_model(apply_to_path(truth, pa, tmp_path / "g"))
    assert not out.config.tie_word_embeddings
    x = make_inputs("gpt2")
    assert rel_err(logits(out, x), logits(a, x)) < 1e-10


def test_streamed_reader_reads_one_tensor_and_rows(tmp_path):
    (a,), (pa,) = _saved(tmp_path, "llama", seeds=(0,))
    ck = StreamedCheckpoint(pa)
    _, params = standard_params(a)
    assert set(ck.shapes) == set(params)
    assert torch.equal(ck.read("tok_embed.weight", (3, 7)), params["tok_embed.weight"][3:7])
    assert ck.fingerprint() == lf.symmetry.model_fingerprint(a)


def test_a_class_without_a_layout_is_refused_in_one_line(tmp_path, monkeypatch):
    from lmc_fast.models.adapters.hf_llama import HFLlamaAdapter

    (_, _), (pa, pb) = _saved(tmp_path, "hf_llama")
    monkeypatch.setattr(HFLlamaAdapter, "layout", lambda self, model: None)
    with pytest.raises(lf.UnsupportedModelError, match="cannot be streamed.*load_model"):
        lf.align(pa, pb, "weight")


@pytest.mark.parametrize("call, message", [
    (lambda a, pa, pb: lf.align(a, pb, "weight"), "both models or both checkpoint paths"),
    (lambda a, pa, pb: lf.align(pa, pb, "weight", order="random"), "needs both models in memory"),
    (lambda a, pa, pb: lf.align(pa, pb, "learned", data=[1]), "needs both models in memory"),
    (lambda a, pa, pb: apply_to_path(Alignment.identity(canonical_spec(standard_params(a)[0])), pb, pb),
     "overlaps the input"),
    (lambda a, pa, pb: apply_to_path(Alignment.identity(canonical_spec(standard_params(a)[0])), pb, pb / "x"),
     "overlaps the input"),
    (lambda a, pa, pb: merge_paths([pa, pb], pa.parent / "m", weights=[0.5, 0.6]), "sum to 1"),
    (lambda a, pa, pb: merge_paths([pa], pa.parent / "m"), "at least two"),
])
def test_bad_streamed_calls_are_refused(tmp_path, call, message):
    (a, _), (pa, pb) = _saved(tmp_path, "llama")
    before = sorted(p.name for p in tmp_path.rglob("*"))
    with pytest.raises(ValueError, match=message):
        call(a, pa, pb)
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # nothing written, nothing removed


def test_alignment_for_another_model_is_refused(tmp_path):
    (a, b), (pa, pb) = _saved(tmp_path, "llama")
    al = lf.align(pa, pb, "weight")
    from lmc_fast.symmetry.alignment import AlignmentMismatchError

    with pytest.raises(AlignmentMismatchError, match="fingerprint"):
        apply_to_path(al, pa, tmp_path / "wrong")
    assert not (tmp_path / "wrong").exists()
    apply_to_path(al, pa, tmp_path / "forced", force=True)


@pytest.mark.parametrize("kind", STREAMABLE)
def test_streamed_barrier_equals_the_fused_engine(tmp_path, tiny_row_blocks, kind):
    (a, b), (pa, pb) = _saved(tmp_path, kind)
    data = make_batches(kind)
    al = lf.align(pa, pb, "weight")
    for kwargs, models in (({"align": al}, (a, al.apply(b))), ({"space": "raw"}, (a, b))):
        mem = lf.barrier(*models, data, lambdas=5, dtype=torch.float64, space=kwargs.get("space", "canonical"))
        streamed = lf.barrier(pa, pb, data, lambdas=5, dtype=torch.float64, **kwargs)
        assert streamed.engine == "streamed" and streamed.streamed["bytes_read"] > 0
        for field in ("loss", "acc", "ece"):
            assert getattr(streamed, field) == pytest.approx(getattr(mem, field), abs=1e-12), field
        assert streamed.barrier == pytest.approx(mem.barrier, abs=1e-12)


def test_streamed_barrier_mixes_in_chunks_to_the_same_numbers(tmp_path, monkeypatch):
    """A tensor's K mixtures made one at a time (a 7B MLP matrix's do not fit MIX_BYTES together), into the
    reused buffer, give the numbers of all K at once; and batches carried one by one, those of one group."""
    from lmc_fast.sweep import streamed

    (a, b), (pa, pb) = _saved(tmp_path, "llama")
    data = make_batches("llama", n=3)
    al = lf.align(pa, pb, "weight")
    whole = lf.barrier(pa, pb, data, lambdas=5, dtype=torch.float64, align=al)
    monkeypatch.setattr(streamed, "MIX_BYTES", 1)
    monkeypatch.setattr(streamed, "MAX_TOKENS", {"cpu": 1})
    split = lf.barrier(pa, pb, data, lambdas=5, dtype=torch.float64, align=al)
    assert (whole.streamed["groups"], split.streamed["groups"]) == (1, 3)
    for field in ("loss", "acc", "ece"):
        assert getattr(split, field) == pytest.approx(getattr(whole, field), abs=1e-12), field


def test_streamed_adaptive_lambdas_take_the_in_memory_rounds(tmp_path):
    """lambdas="adaptive" streamed: a pass per round (the coarse grid, then one point at the peak a round),
    the same points and numbers as the in-memory refinement (float64)."""
    from lmc_fast.sweep.adaptive import Adaptive

    (a, b), (pa, pb) = _saved(tmp_path, "llama")
    data = make_batches("llama")
    al = lf.align(pa, pb, "weight")
    settings = Adaptive(tol=1e-6, max_evaluations=9)
    mem = lf.barrier(a, al.apply(b), data, lambdas=settings, dtype=torch.float64, space=al.spec.space)
    streamed = lf.barrier(pa, pb, data, lambdas=settings, dtype=torch.float64, align=al)
    # the parabola's vertex amplifies float64 rounding of the losses: the points agree to 1e-9, not bitwise
    assert streamed.lambdas == pytest.approx(mem.lambdas, abs=1e-9) and streamed.adaptive == mem.adaptive
    assert streamed.adaptive["rounds"] >= 1 and streamed.streamed["passes"] == 1 + streamed.adaptive["rounds"]
    assert streamed.streamed["lambdas"] == len(streamed.lambdas)
    assert streamed.loss == pytest.approx(mem.loss, abs=1e-12) and streamed.barrier == pytest.approx(mem.barrier, abs=1e-12)


def test_streamed_barrier_plans_its_groups_within_max_memory(tmp_path):
    """max_memory: the batch groups shrink to what the plan fits (same numbers), and a sweep of which even one
    batch at a time does not fit is refused in one line before anything is read."""
    from lmc_fast.stream.checkpoint import StreamedCheckpoint
    from lmc_fast.stream.pieces import Blocks
    from lmc_fast.sweep.streamed import planned_bytes

    (a, b), (pa, pb) = _saved(tmp_path, "llama")
    data = make_batches("llama", n=3)
    al = lf.align(pa, pb, "weight")
    whole = lf.barrier(pa, pb, data, lambdas=5, dtype=torch.float64, align=al)
    shapes = Blocks([StreamedCheckpoint(pa)] * 2, al.spec, torch.float64).shapes
    one = data[0][0].numel()
    fits_one = planned_bytes(al.spec.arch, shapes, 5, 3 * one, one, 8)
    assert whole.streamed["groups"] == 1 and whole.streamed["planned_bytes"] > fits_one
    tight = lf.barrier(pa, pb, data, lambdas=5, dtype=torch.float64, align=al, max_memory=fits_one)
    assert tight.streamed["groups"] == 3 and tight.streamed["planned_bytes"] <= fits_one
    for field in ("loss", "acc", "ece"):
        assert getattr(tight, field) == pytest.approx(getattr(whole, field), abs=1e-12), field
    with pytest.raises(ValueError, match=r"^streamed sweep needs about .* available; use fewer or smaller batches"):
        lf.barrier(pa, pb, data, lambdas=5, dtype=torch.float64, align=al, max_memory=fits_one - 1)


def test_streamed_barrier_carries_neighbouring_batches_of_one_shape_as_one():
    """sweep/streamed.grouped: a layer is mixed once per group, so neighbours of one shape are concatenated
    (order kept) while the group stays within the budget; another shape, or a batch over the budget, starts a
    new group; batches that are not tensors pass alone."""
    from lmc_fast.sweep.streamed import grouped

    def batch(b, t, seed):
        x = torch.randint(0, 50, (b, t), generator=torch.Generator().manual_seed(seed))
        return x, x + 1

    bs = [batch(2, 8, 0), batch(2, 8, 1), batch(2, 8, 2), batch(2, 6, 3), batch(1, 6, 4), batch(9, 6, 5)]
    out = grouped(bs, budget=40)
    assert [tuple(x.shape) for x, _ in out] == [(4, 8), (2, 8), (3, 6), (9, 6)]
    assert torch.equal(out[0][0], torch.cat([bs[0][0], bs[1][0]])) and torch.equal(out[0][1], out[0][0] + 1)
    assert torch.equal(out[2][0], torch.cat([bs[3][0], bs[4][0]]))
    assert sum(x.numel() for x, _ in out) == sum(x.numel() for x, _ in bs)
    odd = [((1, 2), 0), ((3, 4), 1)]
    assert grouped(odd, budget=100) == odd
    assert len(grouped(bs, budget=10**6)) == 2  # (B, 8) then (B, 6)


def test_streamed_barrier_refuses_what_it_cannot_sweep(tmp_path):
    (a, _), (pa, pb) = _saved(tmp_path, "llama")
    data = make_batches("llama")
    with pytest.raises(ValueError, match="lambdas must be"):
        lf.barrier(pa, pb, data, lambdas="often")
    with pytest.raises(ValueError, match="both models or both checkpoint paths"):
        lf.barrier(a, pb, data)
    bad = [(torch.full((2, 5), 999), torch.zeros(2, 5, dtype=torch.long))]
    with pytest.raises(ValueError, match="token id"):
        lf.barrier(pa, pb, bad)


@pytest.mark.parametrize("kind", STREAMABLE)
@pytest.mark.parametrize("residual_only", [False, True])
def test_streamed_activation_matching_equals_in_memory(tmp_path, tiny_row_blocks, kind, residual_only):
    (a, b), (pa, pb) = _saved(tmp_path, kind)
    data = make_batches(kind)
    mem = lf.align(a, b, "activation", data=data, residual_only=residual_only)
    streamed = lf.align(pa, pb, "activation", data=data, residual_only=residual_only)
    assert streamed.info["streamed"] and streamed.info["tokens"] == mem.info["tokens"]
    assert _max_diff(mem, streamed) < 1e-9  # permutations equal (asserted inside)


def test_cli_align_and_sweep_stream_folders(tmp_path, capsys):
    """lmc-fast align streams two folders by default; sweep --stream gives the in-memory sweep's numbers."""
    from lmc_fast.cli import main
    from lmc_fast.models import ViT, ViTConfig

    paths = []
    for s in range(2):
        torch.manual_seed(s)
        paths.append(str(tmp_path / f"m{s}"))
        save_model(ViT(ViTConfig.digits(d_model=16, n_layer=2, n_head=2, d_mlp=32)), paths[-1],
                   metadata={"data": "digits"})
    w = str(tmp_path / "w.safetensors")
    assert main(["align", *paths, "--out", w, "-q"]) == 0
    assert json.loads((tmp_path / "w.align.json").read_text())["info"]["streamed"] is True
    runs = {}
    for mode in ("memory", "stream"):
        out = tmp_path / f"{mode}.json"
        args = ["sweep", *paths, "--align", w, "--lambdas", "5", "--max-batches", "2", "--out", str(out), "-q"]
        assert main(args + (["--stream"] if mode == "stream" else [])) == 0
        runs[mode] = json.loads(out.read_text())["results"]["weight"]
    assert runs["stream"]["engine"] == "streamed"
    assert runs["stream"]["loss"] == pytest.approx(runs["memory"]["loss"], rel=1e-5)
    assert runs["stream"]["barrier"] == pytest.approx(runs["memory"]["barrier"], rel=1e-4, abs=1e-6)
    out = tmp_path / "adaptive.json"
    assert main(["sweep", *paths, "--align", w, "--lambdas", "adaptive", "--max-batches", "2", "--stream",
                 "--out", str(out), "-q"]) == 0
    adaptive = json.loads(out.read_text())["results"]["weight"]
    assert adaptive["engine"] == "streamed" and adaptive["adaptive"]["evaluations"] == len(adaptive["lambdas"]) >= 5


@pytest.mark.parametrize("option", [{"engine": "loop"}, {"checkpoint": "ckpt"},
                                    {"max_tokens": 4096}, {"device": "meta"}, {"chunk": 4}])
def test_streamed_barrier_refuses_in_memory_settings(tmp_path, option):
    (_, _), (pa, pb) = _saved(tmp_path, "llama")
    with pytest.raises(ValueError, match=f"{next(iter(option))} is not an option of a sweep of checkpoint paths"):
        lf.barrier(pa, pb, make_batches("llama"), **option)


def test_streamed_activation_matching_takes_float32_images(tmp_path):
    """Images come in float32 whatever the checkpoint's precision (the CLI's data): cast like in memory."""
    (a, b), (pa, pb) = _saved(tmp_path, "vit")
    data = [(x.float(), y) for x, y in make_batches("vit")]
    mem = lf.align(a, b, "activation", data=data)
    assert _max_diff(mem, lf.align(pa, pb, "activation", data=data)) < 1e-9
    assert lf.barrier(pa, pb, data, lambdas=3).streamed["tokens"] > 0
