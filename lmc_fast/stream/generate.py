"""Random checkpoints of a real shape written block by block, never whole in memory: test and benchmark
pairs at the 1B and 7B scale without downloading anything.

    from lmc_fast.stream.generate import write_random, llama_on_meta
    write_random("/tmp/a", llama_on_meta("tinyllama-1.1b"), seed=0)       # ~2.2 GB of bf16 shards

Weights ~ N(0, std), norm scales 1 + N(0, 0.1) (so the canonical form has work to do), other vectors
~ N(0, std): random, not trained, but exactly the layout and sizes a Hub checkpoint of that config has.
"""
from __future__ import annotations

import math

import torch

from ..models.adapters import adapter_for
from ..symmetry.canonical import coupled_blocks
from .write import Template, write_checkpoint

#: published configurations (the fields that shape the tensors), Hugging Face names
CONFIGS = {
    "tinyllama-1.1b": dict(model_type="llama", num_hidden_layers=22, hidden_size=2048, num_attention_heads=32,
                           num_key_value_heads=4, intermediate_size=5632, vocab_size=32000,
                           max_position_embeddings=2048, rms_norm_eps=1e-5, tie_word_embeddings=False),
    "mistral-7b": dict(model_type="mistral", num_hidden_layers=32, hidden_size=4096, num_attention_heads=32,
                       num_key_value_heads=8, intermediate_size=14336, vocab_size=32000,
                       max_position_embeddings=32768, rms_norm_eps=1e-5, sliding_window=None,
                       tie_word_embeddings=False),
    # a small model of the same family for tests
    "llama-tiny": dict(model_type="llama", num_hidden_layers=4, hidden_size=256, num_attention_heads=8,
                       num_key_value_heads=2, intermediate_size=704, vocab_size=16000,
                       max_position_embeddings=256, rms_norm_eps=1e-5, tie_word_embeddings=False),
}
#: largest block of one tensor generated at once (float32)
BLOCK_BYTES = 64 * 2**20


def llama_on_meta(name: str, **changes):
    """The Hugging Face model of a CONFIGS entry, built on the meta device (shapes, no memory)."""
    import transformers

    fields = {**CONFIGS[name], **changes}
    config = transformers.AutoConfig.for_model(**fields)
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(config)


def write_random(out, meta_model, seed: int, dtype=torch.bfloat16, std: float = 0.02):
    """Write a random checkpoint shaped like `meta_model` (ours or Hugging Face) to the folder `out`."""
    template = Template.of_model(meta_model, dtype)
    arch = adapter_for(meta_model).arch(meta_model)
    gen = torch.Generator().manual_seed(seed)

    def produce():
        for block in coupled_blocks(arch, list(template.shapes)):
            for name in block:
                shape = template.shapes[name]
                if len(shape) == 1:
                    is_norm = name.rsplit(".", 2)[-2].startswith("ln")
                    v = torch.randn(shape, generator=gen) * (0.1 if is_norm else std)
                    yield {name: v + 1 if is_norm else v}, {}
                    continue
                rows = max(1, BLOCK_BYTES // (4 * math.prod(shape[1:])))
                for start in range(0, shape[0], rows):
                    stop = min(start + rows, shape[0])
                    yield {name: torch.randn((stop - start, *shape[1:]), generator=gen).mul_(std)}, {name: (start, stop)}

    return write_checkpoint(out, template, produce)
