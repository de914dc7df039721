"""transformers.GPTNeoXForCausalLM (Pythia, PolyPythias): a fused query_key_value whose rows are laid
out per head ([q_h; k_h; v_h] for each head h), LayerNorms with biases, parallel attention and MLP
(use_parallel_residual) or sequential blocks, rotary positions on the first
int(head_size * partial_rotary_factor) dims of each head, an untied output embedding."""
from __future__ import annotations

import torch

from ..arch import Arch
from .base import (Adapter, ConfigSizes, Export, Source, UnsupportedModelError, _fresh_like, _load_lm_head, _tied,
                   from_layout)

ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}


class HFGPTNeoXAdapter(Adapter):
    CONFIG_SIZES = ConfigSizes(required=("num_hidden_layers", "hidden_size", "num_attention_heads",
                                         "intermediate_size", "vocab_size", "max_position_embeddings"),
                               optional=(), divides=("hidden_size", "num_attention_heads"), layers="num_hidden_layers")
    mlp_width_field = "intermediate_size"
    # (theirs under gpt_neox.layers.L., ours under blocks.L.), q / k / v apart (fused in query_key_value)
    LAYER_NAMES = (("input_layernorm", "ln1"), ("post_attention_layernorm", "ln2"), ("attention.dense", "attn.o"),
                   ("mlp.dense_h_to_4h", "mlp.fc1"), ("mlp.dense_4h_to_h", "mlp.fc2"))
    FIELDS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size",
              "max_position_embeddings", "layer_norm_eps", "hidden_act", "use_parallel_residual", "attention_bias")

    @staticmethod
    def _rope(c) -> tuple[float, float, str]:
        """(theta, partial rotary factor, rope type): transformers >= 5 keeps them in rope_parameters,
        older versions in rotary_emb_base, rotary_pct and rope_scaling."""
        rope = getattr(c, "rope_parameters", None) or {}
        scaling = getattr(c, "rope_scaling", None) or {}
        theta = rope.get("rope_theta", getattr(c, "rotary_emb_base", 10000.0))
        factor = rope.get("partial_rotary_factor", getattr(c, "rotary_pct", 1.0))
        kind = rope.get("rope_type", scaling.get("rope_type", scaling.get("type", "default")))
        return float(theta), float(factor), kind

    def _head_key(self, state) -> str:
        """The output embedding's name: lm_head (transformers >= 5) or embed_out (older versions)."""
        return "embed_out.weight" if "embed_out.weight" in state else "lm_head.weight"

    def arch(self, model):
        c = model.config
        act = ACTIVATIONS.get(c.hidden_act)
        if act is None:
            raise UnsupportedModelError(f"GPTNeoXForCausalLM hidden_act={c.hidden_act!r} is not supported "
                                        f"(supported: {', '.join(ACTIVATIONS)})")
        theta, factor, kind = self._rope(c)
        if kind != "default":
            raise UnsupportedModelError(f"GPTNeoXForCausalLM rope_type={kind!r} (rope scaling) is not supported "
                                        "(only the default rotary positions)")
        head_dim = c.hidden_size // c.num_attention_heads
        rotary_dim = int(head_dim * factor)
        if rotary_dim < 2 or rotary_dim % 2:
            raise UnsupportedModelError(f"GPTNeoXForCausalLM partial_rotary_factor={factor} gives {rotary_dim} rotary "
                                        f"dims of a {head_dim}-dim head: only an even number >= 2 can be mapped")
        bias = bool(getattr(c, "attention_bias", True))
        return Arch.neox(c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.intermediate_size,
                         eps=float(c.layer_norm_eps), activation=act, rope_theta=theta, rotary_dim=rotary_dim,
                         residual="parallel" if c.use_parallel_residual else "sequential",
                         qkv_bias=bias, o_bias=bias)

    def config_fields(self, model):
        c, a = model.config, self.arch(model)  # arch() refuses what cannot be mapped
        out = {k: getattr(c, k, None) for k in self.FIELDS}
        out.update(rope_theta=a.rope_theta, rotary_dim=a.rotary_dim)
        return out

    def shape_fields(self, model):
        return {"vocab_size": model.config.vocab_size, "context": model.config.max_position_embeddings}

    def get(self, model):
        return from_layout(self.layout(model), model.state_dict())

    def layout(self, model):
        state, c = model.state_dict(), model.config
        H, d = c.num_attention_heads, c.hidden_size
        p = {"tok_embed.weight": Source("gpt_neox.embed_in.weight")}
        for l in range(c.num_hidden_layers):
            h, b = f"gpt_neox.layers.{l}.", f"blocks.{l}."
            for t in ("weight", "bias"):
                key = h + f"attention.query_key_value.{t}"
                if key in state:  # rows per head: [q_h; k_h; v_h]
                    for i, n in enumerate("qkv"):
                        p[b + f"attn.{n}.{t}"] = Source(
                            key, lambda x, i=i: x.reshape(H, 3, d // H, *x.shape[1:])[:, i].reshape(d, *x.shape[1:]))
                for theirs, ours in self.LAYER_NAMES:
                    if h + f"{theirs}.{t}" in state:
                        p[b + f"{ours}.{t}"] = Source(h + f"{theirs}.{t}")
        for t in ("weight", "bias"):
            p[f"ln_f.{t}"] = Source(f"gpt_neox.final_layer_norm.{t}")
        tied = getattr(c, "tie_word_embeddings", False)
        p["lm_head.weight"] = Source("gpt_neox.embed_in.weight" if tied else self._head_key(state))
        return p

    def export(self, model):
        state, c = model.state_dict(), model.config
        H, d = c.num_attention_heads, c.hidden_size

        def fused(q, k, v):  # back to rows per head [q_h; k_h; v_h]
            parts = [x.reshape(H, 1, d // H, *x.shape[1:]) for x in (q, k, v)]
            return torch.cat(parts, dim=1).reshape(3 * d, *q.shape[1:])

        out = {"gpt_neox.embed_in.weight": Export(("tok_embed.weight",))}
        for l in range(c.num_hidden_layers):
            h, b = f"gpt_neox.layers.{l}.", f"blocks.{l}."
            for t in ("weight", "bias"):
                if h + f"attention.query_key_value.{t}" in state:
                    out[h + f"attention.query_key_value.{t}"] = Export(tuple(b + f"attn.{n}.{t}" for n in "qkv"), fused)
                for theirs, ours in self.LAYER_NAMES:
                    if h + f"{theirs}.{t}" in state:
                        out[h + f"{theirs}.{t}"] = Export((b + f"{ours}.{t}",))
        for t in ("weight", "bias"):
            out[f"gpt_neox.final_layer_norm.{t}"] = Export((f"ln_f.{t}",))
        out[self._head_key(state)] = Export(("lm_head.weight",))
        return out

    def build(self, template, params):
        tie = _tied(params)
        model = _fresh_like(template, tie_word_embeddings=tie)
        c = model.config
        H, d = c.num_attention_heads, c.hidden_size
        sd = {"gpt_neox.embed_in.weight": params["tok_embed.weight"]}
        for l in range(c.num_hidden_layers):
            h, b = f"gpt_neox.layers.{l}.", f"blocks.{l}."
            for t in ("weight", "bias"):
                if b + f"attn.q.{t}" in params:
                    parts = [params[b + f"attn.{n}.{t}"].reshape(H, 1, d // H, *params[b + f"attn.{n}.{t}"].shape[1:])
                             for n in "qkv"]
                    fused = torch.cat(parts, dim=1)  # (H, 3, d_h, ...): rows per head [q_h; k_h; v_h]
                    sd[h + f"attention.query_key_value.{t}"] = fused.reshape(3 * d, *parts[0].shape[3:])
                for theirs, ours in self.LAYER_NAMES:
                    if b + f"{ours}.{t}" in params:
                        sd[h + f"{theirs}.{t}"] = params[b + f"{ours}.{t}"]
        for t in ("weight", "bias"):
            sd[f"gpt_neox.final_layer_norm.{t}"] = params[f"ln_f.{t}"]
        return _load_lm_head(model, sd, params, tie, head_key=self._head_key(model.state_dict()))

    def logits(self, model, inputs):
        return model(input_ids=inputs).logits
