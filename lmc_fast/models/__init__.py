"""Reference models and the adapters that map any supported model to standard parameters."""
from .gpt2 import GPT2, GPT2Config
from .vit import ViT, ViTConfig

__all__ = ["ViT", "ViTConfig", "GPT2", "GPT2Config"]
