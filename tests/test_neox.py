"""GPT-NeoX (Pythia, PolyPythias): the reference NeoX and Hugging Face's GPTNeoXForCausalLM through one
adapter, the partial-rotary head symmetry, Hub-layout checkpoints, refusals and learned matching.
Tiny configs in float64 (the zoo's neox / hf_neox / hf_neox_seq also join every planted-recovery and
function-preservation test)."""
from __future__ import annotations

import json
import warnings

import pytest
import torch

import lmc_fast as lf
from lmc_fast.io import load_model, save_model
from lmc_fast.models import NeoX, NeoXConfig
from lmc_fast.models import functional as Fn
from lmc_fast.models.adapters import HFGPTNeoXAdapter, UnsupportedModelError, adapter_for, standard_params
from lmc_fast.symmetry import canonical_params, canonical_spec
from lmc_fast.symmetry import elements as E
from zoo import learned_lowers_a_planted_barrier, lerp_kernel_matches_batched, logits, make_model, rel_err

transformers = pytest.importorskip("transformers")

VOCAB, T = 41, 12
#: Hugging Face computes its rotary tables in float32 even in a float64 model: logits agree to ~1e-7
HF_ATOL = 1e-6


def hf_neox(seed: int = 0, dtype=torch.float64, **overrides):
    base = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                max_position_embeddings=64, rotary_pct=0.25, bos_token_id=0, eos_token_id=0)
    base.update(overrides)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.manual_seed(seed)
        model = transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(**base))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # random norms and biases too (HF starts them at one and zero)
        for name, p in model.named_parameters():
            noise = 0.3 * torch.randn(p.shape, generator=gen, dtype=torch.float64)
            p.copy_((1 + noise) if "layernorm" in name and name.endswith("weight") else noise)
    return model.to(dtype).eval()


def ids(seed: int = 0, batch: int = 3, length: int = T):
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def functional_logits(arch, params, x):
    return Fn.forward(arch, {k: v.unsqueeze(0) for k, v in params.items()}, x)[0]


CASES = {"parallel-quarter": dict(), "parallel-half": dict(rotary_pct=0.5),
         "sequential": dict(use_parallel_residual=False), "full-rotary": dict(rotary_pct=1.0),
         "no-attention-bias": dict(attention_bias=False), "gelu-tanh": dict(hidden_act="gelu_new", rotary_emb_base=500)}


# ---------------------------------------------------------------- the adapter
@pytest.mark.parametrize("case", CASES)
def test_hugging_face_neox_equals_the_functional_forward_and_rebuilds_exactly(case):
    m = hf_neox(**CASES[case])
    arch, p = standard_params(m)
    x = ids()
    assert (functional_logits(arch, p, x) - m(input_ids=x).logits).abs().max() < HF_ATOL
    back = adapter_for(m).build(m, p)
    assert all(torch.equal(a, b) for a, b in zip(m.state_dict().values(), back.state_dict().values()))
    assert arch.rotary_dim == int(8 * CASES[case].get("rotary_pct", 0.25))
    assert arch.residual == ("sequential" if case == "sequential" else "parallel")


@pytest.mark.parametrize("parallel", [True, False])
def test_reference_neox_computes_what_hugging_face_computes(parallel):
    hf = hf_neox(rotary_pct=0.5, use_parallel_residual=parallel)
    ours = NeoX(NeoXConfig(n_layer=2, d_model=32, n_head=4, d_mlp=48, vocab_size=VOCAB, block_size=64,
                           rotary_pct=0.5, parallel_residual=parallel)).double()
    ours = adapter_for(ours).build(ours, standard_params(hf)[1])
    x = ids(1)
    assert (ours(x) - hf(input_ids=x).logits).abs().max() < HF_ATOL
    back = HFGPTNeoXAdapter().build(hf, standard_params(ours)[1])
    assert all(torch.equal(a, b) for a, b in zip(hf.state_dict().values(), back.state_dict().values()))


def test_the_fused_qkv_is_split_per_head():
    """Hugging Face's query_key_value rows are [q_0; k_0; v_0; q_1; ...], head by head."""
    m = hf_neox()
    p = HFGPTNeoXAdapter().get(m)
    W = m.gpt_neox.layers[0].attention.query_key_value.weight.detach()
    dh = 8
    for h in range(4):
        for i, n in enumerate("qkv"):
            rows = W[(3 * h + i) * dh:(3 * h + i + 1) * dh]
            assert torch.equal(p[f"blocks.0.attn.{n}.weight"][h * dh:(h + 1) * dh], rows)


@pytest.mark.parametrize("overrides,message", [
    (dict(hidden_act="relu"), "hidden_act='relu' is not supported"),
    (dict(rope_scaling={"rope_type": "linear", "factor": 2.0}), "rope_type='linear'"),
    (dict(rotary_pct=0.125), "gives 1 rotary dims"),
])
def test_unsupported_neox_variants_are_refused_in_one_line(overrides, message):
    m = hf_neox(**overrides)
    with pytest.raises(UnsupportedModelError, match=message) as err:
        standard_params(m)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("field,value,message", [("rotary_pct", 0.0, "rotary_pct must be a number in"),
                                                 ("rotary_pct", 0.1, "gives 1 rotary dims"),
                                                 ("n_head", 5, "not divisible by n_head"),
                                                 ("activation", "relu", "activation must be one of"),
                                                 ("parallel_residual", 1, "must be true or false")])
def test_neox_config_refuses_bad_fields_before_allocating(field, value, message):
    with pytest.raises(ValueError, match=message):
        NeoXConfig(**{field: value})


# ---------------------------------------------------------------- the partial-rotary head symmetry
def _neox_canonical(seed=0):
    # perturbed norms and biases; heads of 16 dims, a quarter (4, two planes) rotary
    m = make_model("neox", seed=seed, vocab=VOCAB, d=64)
    with torch.no_grad():  # attention scores of order one, so that positions matter
        for block in m.blocks:
            block.attn.q.weight.mul_(10), block.attn.k.weight.mul_(10)
    arch, raw = standard_params(m)
    return arch, canonical_params(arch, raw)


@pytest.mark.parametrize("head_map", ["orthogonal", "invertible"])
def test_plane_rotations_and_any_map_of_the_unrotated_dims_keep_the_function(head_map):
    """QK maps block diagonal: one rotation (and scale) per rotary plane, any orthogonal (invertible) map
    of the dims no position touches; exact in float64."""
    arch, c = _neox_canonical()
    spec = canonical_spec(arch, head_map)
    g = torch.Generator().manual_seed(1)
    els = {n: E.random_element(group, g) for n, group in spec.groups.items()}
    qk = els["heads.0"]["qk"]
    r = arch.rotary_dim
    assert r < arch.head_dim and qk[:, r:, r:].abs().min() > 0  # the unrotated block really is general
    assert qk[:, :r, r:].abs().max() == 0 and qk[:, r:, :r].abs().max() == 0
    x = ids(2)
    moved = E.apply_spec(spec, c, els)
    assert (functional_logits(arch, moved, x) - functional_logits(arch, c, x)).abs().max() < 1e-10


def test_a_map_mixing_rotary_and_unrotated_dims_breaks_the_function_and_is_refused():
    arch, c = _neox_canonical()
    spec = canonical_spec(arch)
    group = spec.groups["heads.0"]
    g = torch.Generator().manual_seed(3)
    el = E.identity(group)
    el["qk"] = E.random_orthogonal(arch.head_dim, g, batch=(arch.n_head,))
    x = ids(4)
    moved = E.apply_spec(spec, c, {"heads.0": el})
    assert (functional_logits(arch, moved, x) - functional_logits(arch, c, x)).abs().max() > 1e-3
    with pytest.raises(E.InvalidAlignmentError, match="does not commute with the rotary positions"):
        E.validate(group, el)
    # a general rotation of the rotary dims alone (the unrotated block left as it is): refused too
    el["qk"] = torch.eye(arch.head_dim, dtype=torch.float64).repeat(arch.n_head, 1, 1)
    el["qk"][:, :arch.rotary_dim, :arch.rotary_dim] = E.random_orthogonal(arch.rotary_dim, g, batch=(arch.n_head,))
    moved = E.apply_spec(spec, c, {"heads.0": el})
    assert (functional_logits(arch, moved, x) - functional_logits(arch, c, x)).abs().max() > 1e-3
    with pytest.raises(E.InvalidAlignmentError, match="does not commute with the rotary positions"):
        E.validate(group, el)


def test_nearest_rotary_maximises_the_trace_over_both_blocks():
    """nearest_rotary(C, r) beats every other element of the group on tr(M^T C) (random search)."""
    g = torch.Generator().manual_seed(5)
    C = torch.randn(8, 8, generator=g, dtype=torch.float64)
    best = E.nearest_rotary(C, 4)
    value = torch.trace(best.T @ C)
    for _ in range(200):
        M = E.random_rotary(8, g, rotary_dim=4)
        assert torch.trace(M.T @ C) <= value + 1e-12


# ---------------------------------------------------------------- checkpoints as the Hub stores them
PYTHIA_14M = dict(architectures=["GPTNeoXForCausalLM"], bos_token_id=0, eos_token_id=0, hidden_act="gelu",
                  hidden_size=128, initializer_range=0.02, intermediate_size=512, layer_norm_eps=1e-5,
                  max_position_embeddings=2048, model_type="gpt_neox", num_attention_heads=4, num_hidden_layers=6,
                  rotary_emb_base=10000, rotary_pct=0.25, tie_word_embeddings=False, torch_dtype="float16",
                  use_cache=True, use_parallel_residual=True, vocab_size=50304)


def _write_hub_folder(path, config: dict, seed: int = 0, shards: int = 2):
    """A Pythia checkpoint as the Hub has it: config.json with Pythia's fields (rotary_pct,
    rotary_emb_base), float16 safetensors shards with an index, the head named embed_out and the
    attention mask buffers of the original files; random weights, written shard by shard."""
    from safetensors.torch import save_file

    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    d, f, V, L = config["hidden_size"], config["intermediate_size"], config["vocab_size"], config["num_hidden_layers"]
    gen = torch.Generator().manual_seed(seed)
    rand = lambda *shape: (0.02 * torch.randn(*shape, generator=gen)).half()  # noqa: E731
    names = {}
    layers = [list(range(L))[i::shards] for i in range(shards)]
    for s, part in enumerate(layers):
        tensors = {}
        if s == 0:
            tensors["gpt_neox.embed_in.weight"] = rand(V, d)
        for l in part:
            h = f"gpt_neox.layers.{l}."
            for ln in ("input_layernorm", "post_attention_layernorm"):
                tensors[h + ln + ".weight"] = (1 + rand(d).float()).half()
                tensors[h + ln + ".bias"] = rand(d)
            tensors[h + "attention.query_key_value.weight"] = rand(3 * d, d)
            tensors[h + "attention.query_key_value.bias"] = rand(3 * d)
            tensors[h + "attention.dense.weight"], tensors[h + "attention.dense.bias"] = rand(d, d), rand(d)
            tensors[h + "mlp.dense_h_to_4h.weight"], tensors[h + "mlp.dense_h_to_4h.bias"] = rand(f, d), rand(f)
            tensors[h + "mlp.dense_4h_to_h.weight"], tensors[h + "mlp.dense_4h_to_h.bias"] = rand(d, f), rand(d)
            tensors[h + "attention.bias"] = torch.ones(1, 1, 64, 64, dtype=torch.bool).tril()
            tensors[h + "attention.masked_bias"] = torch.tensor(-1e9)
        if s == shards - 1:
            tensors["gpt_neox.final_layer_norm.weight"] = (1 + rand(d).float()).half()
            tensors["gpt_neox.final_layer_norm.bias"] = rand(d)
            tensors["embed_out.weight"] = rand(V, d)
        name = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        save_file(tensors, str(path / name), metadata={"format": "pt"})
        names.update({k: name for k in tensors})
    size = sum((path / n).stat().st_size for n in set(names.values()))
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": size},
                                                                   "weight_map": names}))
    return path


@pytest.fixture(scope="module")
def pythia_pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("pythia")
    small = dict(PYTHIA_14M, vocab_size=512)  # the published shape but a small vocabulary: seconds, not minutes
    return [_write_hub_folder(root / f"pythia-14m-seed{s}", small, seed=s) for s in (1, 2)]


def test_a_pythia_hub_folder_loads_aligns_and_exports(pythia_pair, tmp_path):
    a, b = (load_model(p) for p in pythia_pair)
    assert type(a).__name__ == "GPTNeoXForCausalLM" and next(a.parameters()).dtype == torch.float16
    arch, _ = standard_params(a)
    assert (arch.n_layer, arch.d_model, arch.n_head, arch.head_dim, arch.rotary_dim, arch.residual) == \
        (6, 128, 4, 32, 8, "parallel")
    a, b = a.float(), b.float()
    al = lf.align(a, b, "weight", max_iter=3)
    x = torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(0))
    aligned = al.apply(b)
    assert rel_err(logits(aligned, x), logits(b, x)) < 1e-4  # a symmetry of B: its function kept
    out = tmp_path / "aligned"
    save_model(aligned, out)
    again = load_model(out)
    assert rel_err(logits(again, x), logits(aligned, x)) < 1e-6


def test_published_pythia_shapes_map_to_the_right_groups():
    """pythia-70m / 160m / 410m as published (built on the meta device: shapes only)."""
    shapes = {"70m": (6, 512, 8, 2048), "160m": (12, 768, 12, 3072), "410m": (24, 1024, 16, 4096)}
    for name, (L, d, H, f) in shapes.items():
        cfg = transformers.GPTNeoXConfig(**{**PYTHIA_14M, "num_hidden_layers": L, "hidden_size": d,
                                            "num_attention_heads": H, "intermediate_size": f})
        with torch.device("meta"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            m = transformers.GPTNeoXForCausalLM(cfg)
        arch = HFGPTNeoXAdapter().arch(m)
        spec = canonical_spec(arch)
        heads = spec.groups["heads.0"]
        assert (heads.n_heads, heads.head_dim, heads.rotary_dim) == (H, d // H, d // H // 4), name
        assert spec.groups["mlp.0"].size == f and spec.groups["residual"].centred


# ---------------------------------------------------------------- learned matching
@pytest.mark.parametrize("head_map", ["orthogonal", "invertible"])
def test_learned_matching_on_neox_lowers_a_planted_barrier(head_map):
    """Partial-rotary QK maps (and parallel blocks): from the identity, learned matching lowers the
    validation barrier of a planted pair, and what it returns is a symmetry of B."""
    learned_lowers_a_planted_barrier("neox", make_model("neox", seed=62, dtype=torch.float32), head_map)


def test_the_table1_grid_spec_parses_and_trains_the_neox_recipe():
    from pathlib import Path

    from lmc_fast.grid.spec import load_spec

    spec = load_spec(Path(__file__).resolve().parents[1] / "bench" / "grids" / "table1_neox.toml")
    assert spec.recipe == "neox-shakespeare" and len(spec.pairs) == 5 and spec.data == "shakespeare"


def test_cli_trains_aligns_and_sweeps_a_neox_on_text(tmp_path, capsys):
    from lmc_fast.cli import main

    text = tmp_path / "t.txt"
    text.write_text("".join(f"line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(40)))
    rc = main(["train", "--model", "neox", "--data", f"text:{text}", "--seeds", "0", "1", "--steps", "2",
               "--block-size", "16", "--out", str(tmp_path / "n"), "-q",
               "--config", "n_layer=1", "d_model=32", "n_head=2", "rotary_pct=0.5"])
    assert rc == 0, capsys.readouterr().err
    m = load_model(tmp_path / "n" / "seed0")
    assert isinstance(m, NeoX) and m.config.d_mlp == 128 and m.arch().rotary_dim == 8
    rc = main(["align", str(tmp_path / "n" / "seed0"), str(tmp_path / "n" / "seed1"), "--method", "weight",
               "--out", str(tmp_path / "w.safetensors"), "-q"])
    assert rc == 0, capsys.readouterr().err
    rc = main(["sweep", str(tmp_path / "n" / "seed0"), str(tmp_path / "n" / "seed1"), "--align",
               str(tmp_path / "w.safetensors"), "--data", f"text:{text}", "--lambdas", "3", "--out",
               str(tmp_path / "r.json"), "-q"])
    assert rc == 0, capsys.readouterr().err
    assert (tmp_path / "r.json").is_file()



def _lerp_pair_and_batch():
    torch.manual_seed(0)
    cfg = NeoXConfig(n_layer=2, d_model=32, n_head=4, d_mlp=48, vocab_size=64, block_size=16, rotary_pct=0.5)
    x = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
    return [NeoX(cfg) for _ in range(2)], (x, x)


def test_lerp_kernel_engine_runs_the_one_forward_on_a_neox():
    """The Triton path (parallel blocks and partial rotary positions) gives the batched engine's numbers (CPU
    interpreter here)."""
    lerp_kernel_matches_batched(*_lerp_pair_and_batch(), "cpu", 1e-4)


@pytest.mark.gpu
def test_lerp_kernel_engine_on_cuda_neox():
    lerp_kernel_matches_batched(*_lerp_pair_and_batch(), "cuda", 1e-3)
