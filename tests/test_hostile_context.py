"""The default block size of a language model's text is min(64, its context), whatever its config
calls the context: a Hugging Face Llama or Mistral with max_position_embeddings 32 was refused
("sequence length 64 exceeds the model's context of 32 positions") without --block-size."""
import json

import pytest
import torch

from lmc_fast.cli import main


def _llama(cls_name, config_name, **extra):
    def make(seed):
        import transformers

        torch.manual_seed(seed)
        config = getattr(transformers, config_name)(vocab_size=256, hidden_size=16, intermediate_size=32,
                                                    num_hidden_layers=1, num_attention_heads=2,
                                                    num_key_value_heads=2, max_position_embeddings=32, **extra)
        return getattr(transformers, cls_name)(config)
    return make


# (case id, maker of a model whose context is max_position_embeddings = 32)
MODELS = [("hf-llama", _llama("LlamaForCausalLM", "LlamaConfig")),
          ("hf-mistral", _llama("MistralForCausalLM", "MistralConfig", sliding_window=None))]


@pytest.mark.parametrize("case", MODELS, ids=[c[0] for c in MODELS])
def test_sweep_takes_the_context_as_the_default_block_size(tmp_path, case):
    _, make = case
    for s in range(2):
        make(s).save_pretrained(tmp_path / f"m{s}")
    text = tmp_path / "t.txt"
    text.write_text("the quick brown fox jumps over the lazy dog.\n" * 40)
    out = tmp_path / "s.json"
    rc = main(["sweep", str(tmp_path / "m0"), str(tmp_path / "m1"), "--data", f"text:{text}", "--out", str(out),
               "--lambdas", "3", "-q"])
    assert rc == 0
    assert len(json.loads(out.read_text())["results"]["none"]["lambdas"]) == 3
