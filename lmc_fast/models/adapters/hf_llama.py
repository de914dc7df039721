"""transformers.LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM."""
from __future__ import annotations

from ..arch import Arch
from .base import (Adapter, ConfigSizes, Source, UnsupportedModelError, _fresh_like, _hf_class, _load_lm_head, _tied,
                   from_layout)


class HFLlamaAdapter(Adapter):
    """transformers.LlamaForCausalLM, MistralForCausalLM and Qwen2ForCausalLM: one layout (separate
    q/k/v/o projections, gate/up/down MLP, RMSNorm, rotary positions), different biases and windows:
    Llama has attention_bias (q, k, v and o) and mlp_bias, Qwen2 always has q/k/v biases and maybe a
    sliding window on some layers (layer_types), Mistral has no biases and a sliding window."""

    mlp_width_field = "intermediate_size"
    MODEL_TYPES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}
    # one set of size fields; (heads, kv heads) is the divisibility grouped-query attention needs
    CONFIG_SIZES = ConfigSizes(required=("num_hidden_layers", "hidden_size", "num_attention_heads",
                                         "intermediate_size", "vocab_size", "max_position_embeddings"),
                               optional=("num_key_value_heads", "head_dim"),
                               divides=("num_attention_heads", "num_key_value_heads"), layers="num_hidden_layers")
    CLASSES = tuple(MODEL_TYPES.values())
    # (theirs under model.layers.L., ours under blocks.L.)
    LAYER_NAMES = (("input_layernorm", "ln1"), ("post_attention_layernorm", "ln2"), ("self_attn.q_proj", "attn.q"),
                   ("self_attn.k_proj", "attn.k"), ("self_attn.v_proj", "attn.v"), ("self_attn.o_proj", "attn.o"),
                   ("mlp.gate_proj", "mlp.gate"), ("mlp.up_proj", "mlp.fc1"), ("mlp.down_proj", "mlp.fc2"))
    # config fields that shape the function, read as they are (the rest are normalised in config_fields)
    FIELDS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size",
              "max_position_embeddings", "rms_norm_eps", "hidden_act")

    @staticmethod
    def _name(model) -> str:
        return type(model).__name__

    def _kind(self, model) -> str:
        for name in self.CLASSES:
            if isinstance(model, _hf_class(name)):
                return name
        raise UnsupportedModelError(f"{self._name(model)} is not one of {', '.join(self.CLASSES)}")

    def _rope(self, model) -> tuple[float, str]:
        """(rope theta, rope type): transformers >= 5 keeps them in config.rope_parameters, older
        versions in config.rope_theta and config.rope_scaling."""
        c = model.config
        rope = getattr(c, "rope_parameters", None) or {}
        scaling = getattr(c, "rope_scaling", None) or {}
        theta = rope.get("rope_theta", getattr(c, "rope_theta", 10000.0))
        kind = rope.get("rope_type", scaling.get("rope_type", scaling.get("type", "default")))
        return float(theta), kind

    def _window(self, model, kind: str):
        """The sliding window every layer has (None: full causal attention)."""
        c = model.config
        if kind == "MistralForCausalLM":
            return getattr(c, "sliding_window", None)
        if kind != "Qwen2ForCausalLM":
            return None
        window = getattr(c, "sliding_window", None) if getattr(c, "use_sliding_window", False) else None
        types = getattr(c, "layer_types", None)
        if types is None:  # transformers < 5: layers from max_window_layers on slide
            sliding = [window is not None and i >= c.max_window_layers for i in range(c.num_hidden_layers)]
        else:
            unknown = sorted(set(types) - {"full_attention", "sliding_attention"})
            if unknown:
                raise UnsupportedModelError(f"Qwen2ForCausalLM layer_types {unknown[0]!r} cannot be mapped")
            sliding = [t == "sliding_attention" for t in types]
        if any(sliding) and not all(sliding):
            raise UnsupportedModelError(
                f"Qwen2ForCausalLM with a sliding window on {sum(sliding)} of {len(sliding)} layers "
                f"(max_window_layers={getattr(c, 'max_window_layers', None)}): only all or none can be mapped")
        return window if all(sliding) and sliding else None

    def arch(self, model):
        c, kind = model.config, self._kind(model)
        if c.hidden_act != "silu":
            raise UnsupportedModelError(f"{kind} hidden_act={c.hidden_act!r} is not supported (only 'silu')")
        theta, rope_type = self._rope(model)
        if rope_type != "default":
            raise UnsupportedModelError(f"{kind} rope_type={rope_type!r} (rope scaling) is not supported "
                                        "(only the default rotary positions)")
        if float(getattr(c, "partial_rotary_factor", None) or 1.0) != 1.0:
            raise UnsupportedModelError(f"{kind} partial_rotary_factor={c.partial_rotary_factor!r} is not supported")
        if kind == "LlamaForCausalLM":
            qkv_bias = o_bias = bool(getattr(c, "attention_bias", False))
            mlp_bias = bool(getattr(c, "mlp_bias", False))
        else:
            qkv_bias, o_bias, mlp_bias = kind == "Qwen2ForCausalLM", False, False
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        return Arch.llama(c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.intermediate_size,
                          n_kv_head=c.num_key_value_heads or c.num_attention_heads, eps=float(c.rms_norm_eps),
                          rope_theta=theta, head_dim=head_dim, window=self._window(model, kind),
                          qkv_bias=qkv_bias, o_bias=o_bias, mlp_bias=mlp_bias)

    def config_fields(self, model):
        c, a = model.config, self.arch(model)  # arch() refuses what cannot be mapped
        out = {k: getattr(c, k, None) for k in self.FIELDS}
        out.update(num_key_value_heads=a.n_kv_head, head_dim=a.head_dim, rope_theta=a.rope_theta,
                   sliding_window=a.window, qkv_bias=a.qkv_bias, o_bias=a.o_bias, mlp_bias=a.mlp_bias)
        return out

    def shape_fields(self, model):
        return {"vocab_size": model.config.vocab_size, "context": model.config.max_position_embeddings}

    def get(self, model):
        return from_layout(self.layout(model), model.state_dict())

    def layout(self, model):
        state = model.state_dict()
        p = {"tok_embed.weight": Source("model.embed_tokens.weight")}
        for l in range(model.config.num_hidden_layers):
            for theirs, ours in self.LAYER_NAMES:
                for t in ("weight", "bias"):
                    key = f"model.layers.{l}.{theirs}.{t}"
                    if key in state:
                        p[f"blocks.{l}.{ours}.{t}"] = Source(key)
        p["ln_f.weight"] = Source("model.norm.weight")
        tied = getattr(model.config, "tie_word_embeddings", False) or "lm_head.weight" not in state
        p["lm_head.weight"] = Source("model.embed_tokens.weight" if tied else "lm_head.weight")
        return p

    def build(self, template, params):
        tie = _tied(params)
        model = _fresh_like(template, tie_word_embeddings=tie)
        config = model.config
        sd = {"model.embed_tokens.weight": params["tok_embed.weight"], "model.norm.weight": params["ln_f.weight"]}
        for l in range(config.num_hidden_layers):
            for theirs, ours in self.LAYER_NAMES:
                for t in ("weight", "bias"):
                    name = f"blocks.{l}.{ours}.{t}"
                    if name in params:
                        sd[f"model.layers.{l}.{theirs}.{t}"] = params[name]
        return _load_lm_head(model, sd, params, tie)

    def logits(self, model, inputs):
        return model(input_ids=inputs).logits
