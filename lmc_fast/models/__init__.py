"""Reference models and the adapters that map any supported model to standard parameters."""
from .bert import Bert, BertConfig
from .dit import DiT, DiTConfig
from .gpt2 import GPT2, GPT2Config
from .llama import Llama, LlamaConfig
from .neox import NeoX, NeoXConfig
from .vit import ViT, ViTConfig



def pad_mlp(model, d_mlp: int):
    """`model` with its MLP zero-padded to width d_mlp: same class, same function (resize.py)."""
    from .resize import pad_mlp as _pad_mlp

    return _pad_mlp(model, d_mlp)


__all__ = ["ViT", "ViTConfig", "GPT2", "GPT2Config", "Llama", "LlamaConfig", "NeoX", "NeoXConfig", "Bert", "BertConfig", "DiT", "DiTConfig", "pad_mlp"]
