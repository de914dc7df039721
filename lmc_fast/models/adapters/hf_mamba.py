"""transformers.MambaForCausalLM: per layer an RMSNorm (norm) and a mixer whose in_proj stacks the x rows over
the gate (z) rows and whose x_proj stacks dt's low-rank rows over B's and C's; the conv1d weight is stored
(d_inner, 1, d_conv); the head is tied to the embedding unless tie_word_embeddings is false."""
from __future__ import annotations

import torch

from ..arch import Arch
from .base import (Adapter, ConfigSizes, Export, Source, UnsupportedModelError, _fresh_like, _load_lm_head, _tied,
                   from_layout)

ACTIVATIONS = {"silu": "silu", "swish": "silu"}
# (theirs under backbone.layers.L., ours under blocks.L.): stored as they are
LAYER_NAMES = (("norm.weight", "ln1.weight"), ("mixer.conv1d.bias", "mamba.conv.bias"),
               ("mixer.dt_proj.weight", "mamba.dt.weight"), ("mixer.dt_proj.bias", "mamba.dt.bias"),
               ("mixer.A_log", "mamba.A_log"), ("mixer.D", "mamba.D"), ("mixer.out_proj.weight", "mamba.out.weight"),
               ("mixer.out_proj.bias", "mamba.out.bias"))


class HFMambaAdapter(Adapter):
    # intermediate_size and a numeric time_step_rank are set by MambaConfig itself (expand * hidden_size,
    # "auto" resolved); nothing needs to divide (the pair below is trivially true)
    CONFIG_SIZES = ConfigSizes(required=("num_hidden_layers", "hidden_size", "intermediate_size", "state_size",
                                         "conv_kernel", "time_step_rank", "vocab_size"),
                               optional=(), divides=("hidden_size", "hidden_size"), layers="num_hidden_layers")
    mlp_width_field = "intermediate_size"
    # the config fields that shape the function (residual_in_fp32 only moves rounding: not among them)
    FIELDS = ("num_hidden_layers", "hidden_size", "intermediate_size", "state_size", "conv_kernel", "time_step_rank",
              "vocab_size", "layer_norm_epsilon", "hidden_act", "use_bias", "use_conv_bias")

    def arch(self, model):
        c = model.config
        act = ACTIVATIONS.get(c.hidden_act)
        if act is None:
            raise UnsupportedModelError(f"MambaForCausalLM hidden_act={c.hidden_act!r} is not supported "
                                        f"(supported: {', '.join(ACTIVATIONS)})")
        return Arch.mamba_lm(c.num_hidden_layers, c.hidden_size, c.intermediate_size, c.state_size,
                             int(c.time_step_rank), c.conv_kernel, eps=float(c.layer_norm_epsilon), activation=act,
                             conv_bias=bool(c.use_conv_bias), proj_bias=bool(c.use_bias))

    def resized(self, template, d_mlp: int):
        raise UnsupportedModelError("MambaForCausalLM models of different intermediate_size cannot be aligned "
                                    "(zero-padding Mamba's inner channels is not implemented)")

    def config_fields(self, model):
        self.arch(model)  # refuses what cannot be mapped
        return {k: getattr(model.config, k, None) for k in self.FIELDS}

    def shape_fields(self, model):
        return {"vocab_size": model.config.vocab_size, "context": None}  # no positions: any length

    def get(self, model):
        return from_layout(self.layout(model), model.state_dict())

    def layout(self, model):
        state, c = model.state_dict(), model.config
        E, N, r = c.intermediate_size, c.state_size, int(c.time_step_rank)
        p = {"tok_embed.weight": Source("backbone.embeddings.weight")}
        for l in range(c.num_hidden_layers):
            h, b = f"backbone.layers.{l}.", f"blocks.{l}."
            for theirs, ours in LAYER_NAMES:
                if h + theirs in state:
                    p[b + ours] = Source(h + theirs)
            for t in ("weight", "bias"):  # in_proj: x rows, then z rows
                if h + f"mixer.in_proj.{t}" in state:
                    p[b + f"mamba.in_x.{t}"] = Source(h + f"mixer.in_proj.{t}", lambda x, E=E: x[:E])
                    p[b + f"mamba.in_z.{t}"] = Source(h + f"mixer.in_proj.{t}", lambda x, E=E: x[E:])
            p[b + "mamba.conv.weight"] = Source(h + "mixer.conv1d.weight", lambda x: x[:, 0])
            for name, (lo, hi) in (("x_dt", (0, r)), ("x_B", (r, r + N)), ("x_C", (r + N, r + 2 * N))):
                p[b + f"mamba.{name}.weight"] = Source(h + "mixer.x_proj.weight", lambda x, lo=lo, hi=hi: x[lo:hi])
        p["ln_f.weight"] = Source("backbone.norm_f.weight")
        tied = getattr(c, "tie_word_embeddings", True) or "lm_head.weight" not in state
        p["lm_head.weight"] = Source("backbone.embeddings.weight" if tied else "lm_head.weight")
        return p

    def export(self, model):
        state, c = model.state_dict(), model.config
        cat = lambda *xs: torch.cat(xs)  # noqa: E731 - the fused rows, in their stored order
        out = {"backbone.embeddings.weight": Export(("tok_embed.weight",))}
        for l in range(c.num_hidden_layers):
            h, b = f"backbone.layers.{l}.", f"blocks.{l}."
            for theirs, ours in LAYER_NAMES:
                if h + theirs in state:
                    out[h + theirs] = Export((b + ours,))
            for t in ("weight", "bias"):
                if h + f"mixer.in_proj.{t}" in state:
                    out[h + f"mixer.in_proj.{t}"] = Export((b + f"mamba.in_x.{t}", b + f"mamba.in_z.{t}"), cat)
            out[h + "mixer.conv1d.weight"] = Export((b + "mamba.conv.weight",), lambda w: w[:, None])
            out[h + "mixer.x_proj.weight"] = Export(tuple(b + f"mamba.{n}.weight" for n in ("x_dt", "x_B", "x_C")), cat)
        out["backbone.norm_f.weight"] = Export(("ln_f.weight",))
        out["lm_head.weight"] = Export(("lm_head.weight",))
        return out

    def build(self, template, params):
        tie = _tied(params)
        model = _fresh_like(template, tie_word_embeddings=tie)
        exports = self.export(model)
        sd = {key: (params[e.names[0]] if e.make is None else e.make(*(params[n] for n in e.names)))
              for key, e in exports.items() if key != "lm_head.weight"}
        return _load_lm_head(model, sd, params, tie)

    def logits(self, model, inputs):
        return model(input_ids=inputs, use_cache=False).logits
