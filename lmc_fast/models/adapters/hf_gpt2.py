"""transformers.GPT2LMHeadModel."""
from __future__ import annotations

import torch

from ..arch import Arch
from .base import (Adapter, ConfigSizes, Export, Source, UnsupportedModelError, _fresh_like, _load_lm_head, _tied,
                   from_layout)


class HFGPT2Adapter(Adapter):
    """transformers.GPT2LMHeadModel: Conv1D weights are (in, out); Q, K, V fused in c_attn."""

    CONFIG_SIZES = ConfigSizes(required=("n_layer", "n_embd", "n_head", "vocab_size", "n_positions"),
                               optional=("n_inner",), divides=("n_embd", "n_head"), layers="n_layer")

    mlp_width_field = "n_inner"

    def arch(self, model):
        c = model.config
        if getattr(c, "add_cross_attention", False):
            raise UnsupportedModelError("GPT2LMHeadModel with add_cross_attention=True: cross-attention modules cannot be mapped")
        act = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}.get(c.activation_function)
        if act is None:
            raise UnsupportedModelError(f"GPT2LMHeadModel activation_function={c.activation_function!r} is not supported")
        d_mlp = c.n_inner or 4 * c.n_embd
        # reorder_and_upcast_attn changes only the precision of the attention logits, not the function
        return Arch("gpt2", c.n_layer, c.n_embd, c.n_head, d_mlp, "layernorm", c.layer_norm_epsilon, act,
                    scale_attn=bool(getattr(c, "scale_attn_weights", True)),
                    scale_by_layer=bool(getattr(c, "scale_attn_by_inverse_layer_idx", False)))

    # every GPT2Config field that changes shapes or the forward pass (not dropout, not ids)
    FIELDS = ("n_layer", "n_embd", "n_head", "n_inner", "vocab_size", "n_positions", "layer_norm_epsilon",
              "activation_function", "scale_attn_weights", "scale_attn_by_inverse_layer_idx",
              "reorder_and_upcast_attn", "add_cross_attention")

    def config_fields(self, model):
        c = model.config
        out = {k: getattr(c, k, None) for k in self.FIELDS}
        out["n_inner"] = c.n_inner or 4 * c.n_embd  # None means 4 * n_embd
        return out

    def shape_fields(self, model):
        return {"vocab_size": model.config.vocab_size, "context": model.config.n_positions}

    def get(self, model):
        return from_layout(self.layout(model), model.state_dict())

    # per layer: ours <- theirs, transposed (Conv1D stores (in, out)); biases as they are
    CONV1D = (("attn.o", "attn.c_proj"), ("mlp.fc1", "mlp.c_fc"), ("mlp.fc2", "mlp.c_proj"))

    def layout(self, model):
        d = model.config.n_embd
        p = {"tok_embed.weight": Source("transformer.wte.weight"), "pos_embed": Source("transformer.wpe.weight")}
        for l in range(model.config.n_layer):
            h, b = f"transformer.h.{l}.", f"blocks.{l}."
            for i, name in enumerate("qkv"):  # c_attn's columns [q | k | v]
                p[b + f"attn.{name}.weight"] = Source(h + "attn.c_attn.weight", lambda t, i=i: t[:, i * d:(i + 1) * d].T)
                p[b + f"attn.{name}.bias"] = Source(h + "attn.c_attn.bias", lambda t, i=i: t[i * d:(i + 1) * d])
            for ours, theirs in self.CONV1D:
                p[b + f"{ours}.weight"] = Source(h + f"{theirs}.weight", lambda t: t.T)
                p[b + f"{ours}.bias"] = Source(h + f"{theirs}.bias")
            for ours, theirs in (("ln1", "ln_1"), ("ln2", "ln_2")):
                for t in ("weight", "bias"):
                    p[b + f"{ours}.{t}"] = Source(h + f"{theirs}.{t}")
        p["ln_f.weight"], p["ln_f.bias"] = Source("transformer.ln_f.weight"), Source("transformer.ln_f.bias")
        tied = getattr(model.config, "tie_word_embeddings", True)
        p["lm_head.weight"] = Source("transformer.wte.weight" if tied else "lm_head.weight")
        return p

    def export(self, model):
        out = {"transformer.wte.weight": Export(("tok_embed.weight",)), "transformer.wpe.weight": Export(("pos_embed",))}
        for l in range(model.config.n_layer):
            h, b = f"transformer.h.{l}.", f"blocks.{l}."
            out[h + "attn.c_attn.weight"] = Export(tuple(b + f"attn.{n}.weight" for n in "qkv"),
                                                   lambda q, k, v: torch.cat([q.T, k.T, v.T], dim=1))
            out[h + "attn.c_attn.bias"] = Export(tuple(b + f"attn.{n}.bias" for n in "qkv"),
                                                 lambda q, k, v: torch.cat([q, k, v]))
            for ours, theirs in self.CONV1D:
                out[h + f"{theirs}.weight"] = Export((b + f"{ours}.weight",), lambda t: t.T)
                out[h + f"{theirs}.bias"] = Export((b + f"{ours}.bias",))
            for ours, theirs in (("ln1", "ln_1"), ("ln2", "ln_2")):
                for t in ("weight", "bias"):
                    out[h + f"{theirs}.{t}"] = Export((b + f"{ours}.{t}",))
        out["transformer.ln_f.weight"], out["transformer.ln_f.bias"] = Export(("ln_f.weight",)), Export(("ln_f.bias",))
        out["lm_head.weight"] = Export(("lm_head.weight",))
        return out

    def build(self, template, params):
        tie = _tied(params)
        model = _fresh_like(template, tie_word_embeddings=tie)
        config = model.config
        sd = {"transformer.wte.weight": params["tok_embed.weight"], "transformer.wpe.weight": params["pos_embed"]}
        for l in range(config.n_layer):
            h, b = f"transformer.h.{l}.", f"blocks.{l}."
            sd[h + "attn.c_attn.weight"] = torch.cat([params[b + f"attn.{n}.weight"].T for n in "qkv"], dim=1)
            sd[h + "attn.c_attn.bias"] = torch.cat([params[b + f"attn.{n}.bias"] for n in "qkv"])
            sd[h + "attn.c_proj.weight"] = params[b + "attn.o.weight"].T
            sd[h + "attn.c_proj.bias"] = params[b + "attn.o.bias"]
            sd[h + "mlp.c_fc.weight"] = params[b + "mlp.fc1.weight"].T
            sd[h + "mlp.c_fc.bias"] = params[b + "mlp.fc1.bias"]
            sd[h + "mlp.c_proj.weight"] = params[b + "mlp.fc2.weight"].T
            sd[h + "mlp.c_proj.bias"] = params[b + "mlp.fc2.bias"]
            for ours, theirs in (("ln1", "ln_1"), ("ln2", "ln_2")):
                sd[h + f"{theirs}.weight"] = params[b + f"{ours}.weight"]
                sd[h + f"{theirs}.bias"] = params[b + f"{ours}.bias"]
        sd["transformer.ln_f.weight"], sd["transformer.ln_f.bias"] = params["ln_f.weight"], params["ln_f.bias"]
        return _load_lm_head(model, sd, params, tie)

    def logits(self, model, inputs):
        return model(input_ids=inputs).logits
