"""BERT (MultiBERTs): the reference Bert and Hugging Face's BertForMaskedLM / BertForSequenceClassification
through one adapter, the post-norm symmetry group (a permutation of the stream, not a rotation), the
masked-token task, refusals and every matching method on planted pairs. Tiny configs in float64 (the
zoo's bert / hf_bert / hf_bert_cls also join every planted-recovery and function-preservation test)."""
from __future__ import annotations

import warnings

import pytest
import torch

import lmc_fast as lf
from lmc_fast.models import Bert, BertConfig
from lmc_fast.models import functional as Fn
from lmc_fast.models.adapters import HFBertAdapter, UnsupportedModelError, adapter_for, standard_params
from lmc_fast.sweep.metrics import flat_logits_targets, task_of
from lmc_fast.symmetry import Alignment, canonical_params, canonical_spec, permutation_spec
from lmc_fast.symmetry import elements as E
from lmc_fast.symmetry.maps import centred_orthogonal, random_orthogonal
from zoo import (learned_lowers_a_planted_barrier, lerp_kernel_matches_batched, logits, make_batches, make_inputs,
                 make_model, rel_err)

transformers = pytest.importorskip("transformers")

VOCAB, T = 41, 12


def _hf_encoder(config_cls: str, cls: str, seed: int, base: dict, overrides: dict):
    """A Hugging Face BERT-family model in float64 with random weights, norms and biases included."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.manual_seed(seed)
        model = getattr(transformers, cls)(getattr(transformers, config_cls)(**{**base, **overrides}))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # HF starts norms at one and biases at zero
        for name, p in model.named_parameters():
            noise = 0.3 * torch.randn(p.shape, generator=gen, dtype=torch.float64)
            p.copy_((1 + noise) if name.endswith(("LayerNorm.weight", "layer_norm.weight")) else noise)
    return model.double().eval()


def hf_bert(cls="BertForMaskedLM", seed=0, **overrides):
    base = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                max_position_embeddings=16, num_labels=3)
    return _hf_encoder("BertConfig", cls, seed, base, overrides)


def ids(seed=0, batch=3, length=T):
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def functional_logits(arch, params, x):
    return Fn.forward(arch, {k: v.unsqueeze(0) for k, v in params.items()}, x)[0]


# ---------------------------------------------------------------- the adapter
@pytest.mark.parametrize("cls", ["BertForMaskedLM", "BertForSequenceClassification"])
@pytest.mark.parametrize("overrides", [dict(), dict(hidden_act="gelu_new", type_vocab_size=1),
                                       dict(tie_word_embeddings=False)])
def test_hugging_face_bert_equals_the_functional_forward_and_rebuilds_exactly(cls, overrides):
    m = hf_bert(cls, **overrides)
    arch, p = standard_params(m)
    x = ids()
    assert (functional_logits(arch, p, x) - m(input_ids=x).logits).abs().max() < 1e-10
    back = adapter_for(m).build(m, p)
    # an untied head leaves cls.predictions.bias unused (the decoder adds its own): it is rebuilt equal to that
    unused = {"cls.predictions.bias"} if overrides.get("tie_word_embeddings") is False else set()
    assert all(torch.equal(v, back.state_dict()[k]) for k, v in m.state_dict().items() if k not in unused)
    assert arch.post_norm and not arch.causal
    assert task_of(arch) == ("masked_token" if cls == "BertForMaskedLM" else "classify")


@pytest.mark.parametrize("masked_lm", [True, False])
def test_reference_bert_computes_what_hugging_face_computes(masked_lm):
    hf = hf_bert("BertForMaskedLM" if masked_lm else "BertForSequenceClassification")
    ours = Bert(BertConfig(n_layer=2, d_model=32, n_head=4, d_mlp=48, vocab_size=VOCAB, block_size=16,
                           num_classes=None if masked_lm else 3)).double()
    ours = adapter_for(ours).build(ours, standard_params(hf)[1])
    x = ids(1)
    assert (ours(x) - hf(input_ids=x).logits).abs().max() < 1e-10
    back = HFBertAdapter().build(hf, standard_params(ours)[1])
    assert all(torch.equal(a, b) for a, b in zip(hf.state_dict().values(), back.state_dict().values()))


@pytest.mark.parametrize("cls,overrides,message", [
    ("BertForMaskedLM", dict(hidden_act="relu"), "hidden_act='relu' is not supported"),
    ("BertForMaskedLM", dict(is_decoder=True), "is_decoder or add_cross_attention"),
    ("BertForSequenceClassification", dict(num_labels=1), "only single-label classification"),
    ("BertForSequenceClassification", dict(problem_type="multi_label_classification"), "only single-label"),
])
def test_unsupported_bert_variants_are_refused_in_one_line(cls, overrides, message):
    with pytest.raises(UnsupportedModelError, match=message) as err:
        standard_params(hf_bert(cls, **overrides))
    assert "\n" not in str(err.value)


def test_bert_for_pretraining_measures_the_masked_lm_and_keeps_the_next_sentence_head():
    """MultiBERTs' class: the masked-LM logits are what the library measures; the pooler and the
    next-sentence head are carried along, and every group element keeps both functions."""
    m = hf_bert("BertForPreTraining")
    arch, p = standard_params(m)
    x = ids(2)
    out = m(input_ids=x)
    assert (functional_logits(arch, p, x) - out.prediction_logits).abs().max() < 1e-10
    back = adapter_for(m).build(m, p)
    assert all(torch.equal(a, b) for a, b in zip(m.state_dict().values(), back.state_dict().values()))
    spec = canonical_spec(arch)
    assert spec.groups["pooler"].axes[-1].param == "nsp.weight"
    truth = Alignment.random(spec, seed=3)
    moved = truth.apply(m)
    after = moved(input_ids=x)
    assert (after.prediction_logits - out.prediction_logits).abs().max() < 1e-10
    assert (after.seq_relationship_logits - out.seq_relationship_logits).abs().max() < 1e-10
    al = lf.align(m, moved, "weight")
    inv = truth.inverse()
    assert all(torch.equal(al[n]["perm"], inv[n]["perm"]) for n, g in spec.groups.items())


@pytest.mark.parametrize("field,value,message", [("n_head", 5, "not divisible by n_head"),
                                                 ("num_classes", 0, "num_classes must be a positive int"),
                                                 ("activation", "relu", "activation must be one of"),
                                                 ("type_vocab_size", 0, "type_vocab_size must be a positive")])
def test_bert_config_refuses_bad_fields_before_allocating(field, value, message):
    with pytest.raises(ValueError, match=message):
        BertConfig(**{field: value})


# ---------------------------------------------------------------- the masked-token task
def test_masked_token_targets_are_read_in_place_not_shifted():
    logits = torch.randn(2, 5, 7)
    labels = torch.full((2, 5), -100)
    labels[0, 2], labels[1, 4] = 3, 6
    lg, tg = flat_logits_targets(logits, labels, "masked_token")
    kept = tg != -100
    assert torch.equal(lg[kept], torch.stack([logits[0, 2], logits[1, 4]])) and tg[kept].tolist() == [3, 6]
    lg, tg = flat_logits_targets(logits, labels, "next_token")  # what a causal LM would read instead
    assert tg.numel() == 2 * 4
    with pytest.raises(ValueError, match="masked positions' ids"):
        flat_logits_targets(logits, labels[:, :3], "masked_token")


def test_barrier_of_a_masked_lm_counts_only_the_masked_positions():
    a = make_model("bert", seed=1, dtype=torch.float32)
    x = ids(3, batch=4) % 37  # the zoo's vocabulary
    labels = torch.full_like(x, -100)
    labels[:, 5] = x[:, 5]
    masked = x.clone()
    masked[:, 5] = 0
    ev = lf.evaluate(a, [(masked, labels)])
    lg = logits(a, masked)[:, 5]
    want = torch.nn.functional.cross_entropy(lg.double(), x[:, 5]).item()
    assert abs(ev["loss"] - want) < 1e-5 and "ppl" in ev


# ---------------------------------------------------------------- the post-norm symmetry
def _canonical(kind="bert", seed=0):
    m = make_model(kind, seed=seed)
    arch, raw = standard_params(m)
    return arch, canonical_params(arch, raw)


@pytest.mark.parametrize("kind", ["bert", "hf_bert_cls"])
def test_a_permutation_of_the_stream_keeps_the_function_and_a_rotation_does_not(kind):
    """Post-norm: the norms' per-channel scales sit on the stream. A permutation moves them along
    (exact); a rotation, even one keeping the ones vector, does not commute with them."""
    arch, c = _canonical(kind)
    spec = canonical_spec(arch)
    res = spec.groups[spec.residual]
    assert res.kind == "permutation"
    x = make_inputs(kind, seed=4)
    g = torch.Generator().manual_seed(1)
    els = {n: E.random_element(group, g) for n, group in spec.groups.items()}
    moved = E.apply_spec(spec, c, els)
    assert rel_err(functional_logits(arch, moved, x), functional_logits(arch, c, x)) < 1e-10
    R = centred_orthogonal(random_orthogonal(arch.d_model - 1, g))
    rotated = dict(c)
    for ax in res.axes:  # R on every residual axis, as a pre-norm model's residual group would act
        W = rotated[ax.param].movedim(ax.axis, 0)
        rotated[ax.param] = (R @ W.reshape(W.shape[0], -1)).reshape(W.shape).movedim(0, ax.axis)
    assert rel_err(functional_logits(arch, rotated, x), functional_logits(arch, c, x)) > 1e-2


def test_the_masked_lm_transform_has_its_own_permutation_and_a_tied_head_unties():
    arch, c = _canonical("bert")
    spec = canonical_spec(arch)
    assert spec.groups["head_transform"].kind == "permutation"
    assert torch.equal(c["lm_head.weight"], c["tok_embed.weight"])  # tied in the model
    b = Alignment.random(spec, seed=3)
    model = make_model("bert", seed=0)
    moved = b.apply(model)
    assert moved.lm_head.weight is not moved.tok_embed.weight  # untied: the two read different bases
    x = make_inputs("bert", seed=5)
    assert rel_err(logits(moved, x), logits(lf.to_canonical(model), x)) < 1e-10


@pytest.mark.parametrize("kind", ["bert", "hf_bert", "hf_bert_cls"])
def test_weight_matching_recovers_every_planted_permutation_exactly(kind):
    a = make_model(kind, seed=21)
    arch, _ = standard_params(a)
    truth = Alignment.random(canonical_spec(arch), seed=22)
    b = truth.apply(a)
    al = lf.align(a, b, "weight")
    inv = truth.inverse()
    for name, group in al.spec.groups.items():
        assert torch.equal(al[name]["perm"], inv[name]["perm"]), name
    x = make_inputs(kind, seed=6)
    assert rel_err(logits(al.apply(b), x), logits(a, x)) < 1e-8


def test_permutation_baseline_and_raw_spec_on_a_post_norm_model():
    arch, _ = _canonical("bert")
    raw = permutation_spec(arch)
    assert raw.space == "raw" and raw.groups["residual"].kind == "permutation"
    assert {g.head_map for g in raw.groups.values() if g.kind == "heads"} == {"none"}


@pytest.mark.parametrize("head_map", ["orthogonal", "invertible"])
def test_learned_matching_on_bert_lowers_a_planted_barrier(head_map):
    """Permutation latents for the stream, the masked-LM transform and the MLPs, head maps: from the
    identity, learned matching lowers the validation barrier of a planted pair and returns a symmetry of B."""
    a = make_model("bert", seed=62, dtype=torch.float32)
    with torch.no_grad():  # weights of order one: at the zoo's init scale a planted pair is nearly flat already
        for p in a.parameters():
            if p.dim() == 2:
                p.mul_(15)
    learned_lowers_a_planted_barrier("bert", a, head_map)


def test_learned_matching_on_a_hugging_face_sequence_classifier():
    a = make_model("hf_bert_cls", seed=63, dtype=torch.float32)
    b = make_model("hf_bert_cls", seed=64, dtype=torch.float32)
    data = [(make_inputs("hf_bert_cls", seed=s, batch=4), torch.randint(0, 3, (4,))) for s in range(4)]
    al = lf.align(a, b, "learned", data=data, steps=4, eval_every=2, lr=0.05)
    assert "pooler" in al.spec.groups and al.info["steps"] == 4
    x = make_inputs("hf_bert_cls", seed=9)
    assert rel_err(logits(al.apply(b), x), logits(b, x)) < 1e-4


def test_learned_matching_scores_masked_tokens_in_place_not_shifted(monkeypatch):
    """With target "labels" the loss is the masked-token loss at each masked position; it used to be
    scored as next-token prediction (logits at t against the label at t + 1)."""
    import lmc_fast.match.learned as learned

    seen, real = [], learned.task_loss

    def spy(logits, targets, label_smoothing=0.0, task=None):
        seen.append(task)
        return real(logits, targets, label_smoothing, task)

    monkeypatch.setattr(learned, "task_loss", spy)
    a, b = make_model("bert", seed=65, dtype=torch.float32), make_model("bert", seed=66, dtype=torch.float32)
    lf.align(a, b, "learned", data=make_batches("bert", 4), steps=2, eval_every=2, target="labels")
    assert seen and set(seen) == {"masked_token"}


def test_published_bert_base_shape_maps_to_the_right_groups():
    """BERT-base as MultiBERTs publish it (built on the meta device: shapes only)."""
    cfg = transformers.BertConfig(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                                  intermediate_size=3072, max_position_embeddings=512, type_vocab_size=2)
    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = transformers.BertForMaskedLM(cfg)
    spec = canonical_spec(HFBertAdapter().arch(m))
    assert len([g for g in spec.groups.values() if g.kind == "heads"]) == 12
    assert spec.groups["residual"].size == 768 and spec.groups["mlp.0"].size == 3072
    assert spec.groups["heads.0"].head_dim == 64 and not spec.groups["heads.0"].rotary


def test_the_table1_grid_spec_parses_and_trains_the_bert_recipe():
    from pathlib import Path

    from lmc_fast.grid.spec import load_spec

    spec = load_spec(Path(__file__).resolve().parents[1] / "bench" / "grids" / "table1_bert.toml")
    assert spec.recipe == "bert-shakespeare" and len(spec.pairs) == 5 and spec.data == "shakespeare"


def test_masked_blocks_follow_berts_rule_and_never_change():
    from lmc_fast.data import TokenDataset
    from lmc_fast.data.masked import MaskedTokenDataset

    ids = torch.randint(0, 256, (400, 64), generator=torch.Generator().manual_seed(0))
    a, b = MaskedTokenDataset(TokenDataset(ids, 256)), MaskedTokenDataset(TokenDataset(ids, 256))
    assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y)  # drawn once from the seed
    chosen = a.y != -100
    assert abs(chosen.float().mean().item() - 0.15) < 0.01 and chosen.any(1).all()
    assert torch.equal(a.y[chosen], ids[chosen])
    masked = (a.x == 256) & chosen
    assert abs(masked.sum().item() / chosen.sum().item() - 0.8) < 0.03
    assert torch.equal(a.x[~chosen], ids[~chosen]) and a.vocab_size == 257
    sub = a.subset([3, 7])
    assert torch.equal(sub.x, a.x[[3, 7]]) and torch.equal(sub.y, a.y[[3, 7]])


def test_cli_trains_a_bert_on_masked_text_and_sweeps_it(tmp_path, capsys):
    import json

    from lmc_fast.cli import main
    from lmc_fast.io import load_model

    text = tmp_path / "t.txt"
    text.write_text("".join(f"line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(40)))
    rc = main(["train", "--model", "bert", "--data", f"text:{text}", "--seeds", "0", "1", "--steps", "2",
               "--block-size", "16", "--out", str(tmp_path / "b"), "-q",
               "--config", "n_layer=1", "d_model=32", "n_head=2"])
    assert rc == 0, capsys.readouterr().err
    m = load_model(tmp_path / "b" / "seed0")
    assert isinstance(m, Bert) and m.config.vocab_size == 257 and m.config.block_size == 16  # bytes + [MASK]
    rc = main(["align", str(tmp_path / "b" / "seed0"), str(tmp_path / "b" / "seed1"), "--method", "weight",
               "--out", str(tmp_path / "w.safetensors"), "-q"])
    assert rc == 0, capsys.readouterr().err
    rc = main(["sweep", str(tmp_path / "b" / "seed0"), str(tmp_path / "b" / "seed1"), "--align",
               str(tmp_path / "w.safetensors"), "--data", f"text:{text}", "--lambdas", "3", "--out",
               str(tmp_path / "r.json"), "-q"])
    assert rc == 0, capsys.readouterr().err
    record = json.loads((tmp_path / "r.json").read_text())
    barrier = record["results"]["weight"]["barrier"]
    assert barrier == barrier  # a number
    # the test blocks' masked positions, not every token: 16-byte blocks give 2 or 3 targets each
    assert record["examples"] < 16 * 5



def _lerp_pair_and_batch():
    torch.manual_seed(0)
    cfg = BertConfig(n_layer=2, d_model=32, n_head=4, d_mlp=48, vocab_size=64, block_size=16)
    x = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
    masked = torch.rand(2, 16, generator=torch.Generator().manual_seed(2)) < 0.3  # the positions with targets
    return [Bert(cfg) for _ in range(2)], (x, torch.where(masked, x, -100))


def test_lerp_kernel_engine_runs_the_one_forward_on_a_bert():
    """The Triton path (post-norm blocks, the embedding norm mixed after the embeddings, the masked-LM
    transform) gives the batched engine's numbers (CPU interpreter here)."""
    lerp_kernel_matches_batched(*_lerp_pair_and_batch(), "cpu", 1e-4)


@pytest.mark.gpu
def test_lerp_kernel_engine_on_cuda_bert():
    lerp_kernel_matches_batched(*_lerp_pair_and_batch(), "cuda", 1e-3)


def test_a_multiberts_style_folder_loads_aligns_and_exports(tmp_path):
    """A BertForPreTraining folder written the way older checkpoints are: LayerNorm.gamma / .beta names,
    the integer position_ids buffer stored with the weights, the tied decoder stored once."""
    import json

    from safetensors.torch import save_file

    from lmc_fast.io import load_model, save_model

    folders = []
    for seed in (1, 2):
        m = hf_bert("BertForPreTraining", seed=seed).float()
        folder = tmp_path / f"multiberts-seed_{seed}"
        folder.mkdir()
        cfg = {k: v for k, v in m.config.to_dict().items() if k not in ("transformers_version", "dtype")}
        (folder / "config.json").write_text(json.dumps({**cfg, "architectures": ["BertForPreTraining"]}))
        tensors = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"):
                   v.contiguous() for k, v in m.state_dict().items()
                   if k not in ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias")}
        tensors["bert.embeddings.position_ids"] = torch.arange(16)[None]
        save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
        folders.append((folder, m))
    a, b = (load_model(f) for f, _ in folders)
    x = ids(4)
    for loaded, (_, original) in zip((a, b), folders):
        assert type(loaded).__name__ == "BertForPreTraining"
        assert (loaded(input_ids=x).prediction_logits - original(input_ids=x).prediction_logits).abs().max() == 0
    al = lf.align(a, b, "weight")
    aligned = al.apply(b)
    assert rel_err(aligned(input_ids=x).seq_relationship_logits, b(input_ids=x).seq_relationship_logits) < 1e-5
    save_model(aligned, tmp_path / "aligned")
    again = load_model(tmp_path / "aligned")
    assert rel_err(logits(again, x), logits(aligned, x)) < 1e-6


# ---------------------------------------------------------------- RoBERTa
def hf_roberta(cls="RobertaForMaskedLM", seed=0, **overrides):
    base = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                max_position_embeddings=T + 2, num_labels=3, type_vocab_size=1)  # pad id 1: positions from row 2
    return _hf_encoder("RobertaConfig", cls, seed, base, overrides)


def roberta_ids(seed=0, batch=3):
    x = ids(seed, batch)
    return torch.where(x == 1, torch.full_like(x, 2), x)  # never the padding id


@pytest.mark.parametrize("cls", ["RobertaForMaskedLM", "RobertaForSequenceClassification"])
def test_hugging_face_roberta_equals_the_functional_forward_and_rebuilds_exactly(cls):
    m = hf_roberta(cls)
    arch, p = standard_params(m)
    assert (arch.position_offset, arch.reserved_token) == (2, 1)
    x = roberta_ids()
    assert (functional_logits(arch, p, x) - m(input_ids=x).logits).abs().max() < 1e-10
    back = adapter_for(m).build(m, p)
    assert all(torch.equal(a, b) for a, b in zip(m.state_dict().values(), back.state_dict().values()))
    truth = Alignment.random(canonical_spec(arch), seed=2)
    moved = truth.apply(m)
    assert (moved(input_ids=x).logits - m(input_ids=x).logits).abs().max() < 1e-10


def test_roberta_inputs_holding_the_padding_id_are_refused_in_one_line():
    """HF gives a padding token another position (and shifts none of the others): not the function the
    library computes, so such inputs are refused, naming the id."""
    a, b = hf_roberta(seed=1), hf_roberta(seed=2)
    x = roberta_ids()
    x[0, 3] = 1
    with pytest.raises(ValueError, match="token id 1 is the model's padding id") as err:
        lf.barrier(a, b, [(x, x)], 3)
    assert "\n" not in str(err.value)
    with pytest.raises(UnsupportedModelError, match="its masked-LM head uses 'gelu'"):
        standard_params(hf_roberta(hidden_act="gelu_new"))
