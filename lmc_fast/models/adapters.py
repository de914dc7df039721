"""Adapters: every supported model class <-> one set of *standard parameters*.

Standard parameters are a flat dict named like the reference models (nn.Linear's (out, in)
layout, separate q/k/v, an explicit `lm_head.weight` for GPT-2 even when tied). Canonical
form, symmetry specs and matching are written once against these names; an adapter is the
only place that knows a concrete class (Hugging Face's Conv1D layout, fused c_attn, ...).
"""
from __future__ import annotations

import copy
from dataclasses import asdict

import torch
from torch import nn

from ..numerics import all_finite
from .gpt2 import GPT2, GPT2Config
from .llama import Llama, LlamaConfig
from .vit import ViT, ViTConfig


class UnsupportedModelError(TypeError):
    """The model (or one of its modules/settings) has no adapter."""


class IncompatibleModelsError(ValueError):
    """Two models that cannot be combined: an architecture field differs."""


# Arch lives in arch.py; re-exported here for the modules that import it from the adapters
from .arch import Arch  # noqa: E402


class Adapter:
    """Maps one model class to standard parameters and back."""

    #: The config attribute holding the MLP width (for `resized`).
    mlp_width_field = "d_mlp"

    def resized(self, template, d_mlp: int):
        """A fresh model like `template` (class, dtype, device, mode) with MLP width d_mlp."""
        return _fresh_like(template, **{self.mlp_width_field: int(d_mlp)})

    def arch(self, model) -> Arch:
        raise NotImplementedError

    def config_fields(self, model) -> dict:
        """Every config field that shapes the model's function, under the class's own names
        (compared between two models of one class)."""
        raise NotImplementedError

    def shape_fields(self, model) -> dict:
        """Input / output sizes under class-independent names (compared across classes)."""
        raise NotImplementedError

    def common_fields(self, model) -> dict:
        """Class-independent description: the Arch plus the input / output sizes."""
        return {**asdict(self.arch(model)), **self.shape_fields(model)}

    def get(self, model) -> dict[str, torch.Tensor]:
        """Standard parameters (detached clones)."""
        raise NotImplementedError

    def build(self, template, params: dict[str, torch.Tensor]):
        """A new model of the template's class, dtype and device holding `params`."""
        raise NotImplementedError

    def logits(self, model, inputs):
        return model(inputs)


def _tied(params) -> bool:
    return params["lm_head.weight"].shape == params["tok_embed.weight"].shape and torch.equal(
        params["lm_head.weight"], params["tok_embed.weight"]
    )


def _fresh_like(template, **config_changes) -> nn.Module:
    """A new model of the template's class, dtype, device and mode, its config changed as given."""
    config = copy.deepcopy(template.config)
    for key, value in config_changes.items():
        setattr(config, key, value)
    p0 = next(template.parameters())
    return type(template)(config).to(dtype=p0.dtype, device=p0.device).train(template.training)


def _load_lm_head(model: nn.Module, state: dict, params: dict, tie: bool) -> nn.Module:
    """Load a Hugging Face language model's state, its head either tied to the embedding or its own."""
    if not tie:
        state["lm_head.weight"] = params["lm_head.weight"]
    _load(model, state)
    if tie:
        model.tie_weights()
    return model


def _load(model: nn.Module, state: dict[str, torch.Tensor]) -> nn.Module:
    ref = model.state_dict()
    for k, v in state.items():
        if k not in ref:
            raise KeyError(f"internal: {type(model).__name__} has no parameter {k!r}")
        if ref[k].shape != v.shape:
            raise ValueError(f"parameter {k!r}: shape {tuple(v.shape)} does not fit {tuple(ref[k].shape)}")
    p0 = next(model.parameters())
    with torch.no_grad():
        for k, v in state.items():
            ref[k].copy_(v.to(dtype=p0.dtype, device=p0.device))
    return model


class RefViTAdapter(Adapter):
    def arch(self, model):
        c = model.config
        return Arch("vit", c.n_layer, c.d_model, c.n_head, c.d_mlp, c.norm, c.eps, c.activation,
                    qkv_bias=c.qkv_bias)

    def config_fields(self, model):
        return asdict(model.config)

    def shape_fields(self, model):
        c = model.config
        return {"image_size": c.image_size, "patch_size": c.patch_size, "channels": c.channels,
                "num_classes": c.num_classes}

    def get(self, model):
        return {k: v.detach().clone() for k, v in model.state_dict().items()}

    def build(self, template, params):
        return _load(copy.deepcopy(template), params)


class _RefLanguageModelAdapter(Adapter):
    """Our language models (GPT-2, Llama): parameters already under the standard names, and a
    head that may be tied to the token embedding."""

    def config_fields(self, model):
        # tied or not is free: standard parameters always hold lm_head.weight, and build()
        # re-ties exactly when the two matrices come out equal
        out = asdict(model.config)
        out.pop("tie_word_embeddings", None)
        return out

    def shape_fields(self, model):
        return {"vocab_size": model.config.vocab_size, "context": model.config.block_size}

    def get(self, model):
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        state.setdefault("lm_head.weight", state["tok_embed.weight"].clone())
        return state

    def build(self, template, params):
        tie = _tied(params)
        model = _fresh_like(template, tie_word_embeddings=tie)
        config = model.config
        state = dict(params)
        if tie:
            state.pop("lm_head.weight")
        return _load(model, state)


class RefGPT2Adapter(_RefLanguageModelAdapter):
    def arch(self, model):
        c = model.config
        return Arch("gpt2", c.n_layer, c.n_embd, c.n_head, c.d_mlp, c.norm, c.eps, c.activation,
                    qkv_bias=c.qkv_bias)


class RefLlamaAdapter(_RefLanguageModelAdapter):
    """lmc_fast.models.Llama."""

    def arch(self, model):
        return model.arch()


# ---------------------------------------------------------------- Hugging Face models
def _hf_class(name: str):
    import transformers

    return getattr(transformers, name)


class HFGPT2Adapter(Adapter):
    """transformers.GPT2LMHeadModel: Conv1D weights are (in, out); Q, K, V fused in c_attn."""

    # config.json sizes io.py checks before building: (positive sizes, optional sizes, (width, heads), layers)
    CONFIG_SIZES = (("n_layer", "n_embd", "n_head", "vocab_size", "n_positions"), ("n_inner",), ("n_embd", "n_head"),
                    "n_layer")

    mlp_width_field = "n_inner"

    def arch(self, model):
        c = model.config
        if getattr(c, "add_cross_attention", False):
            raise UnsupportedModelError("GPT2LMHeadModel with add_cross_attention=True: cross-attention modules cannot be mapped")
        act = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}.get(c.activation_function)
        if act is None:
            raise UnsupportedModelError(f"GPT2LMHeadModel activation_function={c.activation_function!r} is not supported")
        d_mlp = c.n_inner or 4 * c.n_embd
        return Arch("gpt2", c.n_layer, c.n_embd, c.n_head, d_mlp, "layernorm", c.layer_norm_epsilon, act)

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
        sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
        d = model.config.n_embd
        p = {"tok_embed.weight": sd["transformer.wte.weight"], "pos_embed": sd["transformer.wpe.weight"]}
        for l in range(model.config.n_layer):
            h, b = f"transformer.h.{l}.", f"blocks.{l}."
            W, bias = sd[h + "attn.c_attn.weight"], sd[h + "attn.c_attn.bias"]
            for i, name in enumerate("qkv"):
                p[b + f"attn.{name}.weight"] = W[:, i * d : (i + 1) * d].T.contiguous()
                p[b + f"attn.{name}.bias"] = bias[i * d : (i + 1) * d].clone()
            p[b + "attn.o.weight"] = sd[h + "attn.c_proj.weight"].T.contiguous()
            p[b + "attn.o.bias"] = sd[h + "attn.c_proj.bias"]
            p[b + "mlp.fc1.weight"] = sd[h + "mlp.c_fc.weight"].T.contiguous()
            p[b + "mlp.fc1.bias"] = sd[h + "mlp.c_fc.bias"]
            p[b + "mlp.fc2.weight"] = sd[h + "mlp.c_proj.weight"].T.contiguous()
            p[b + "mlp.fc2.bias"] = sd[h + "mlp.c_proj.bias"]
            for ours, theirs in (("ln1", "ln_1"), ("ln2", "ln_2")):
                p[b + f"{ours}.weight"] = sd[h + f"{theirs}.weight"]
                p[b + f"{ours}.bias"] = sd[h + f"{theirs}.bias"]
        p["ln_f.weight"], p["ln_f.bias"] = sd["transformer.ln_f.weight"], sd["transformer.ln_f.bias"]
        p["lm_head.weight"] = sd.get("lm_head.weight", sd["transformer.wte.weight"]).clone()
        return p

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


class HFViTAdapter(Adapter):
    """transformers.ViTForImageClassification: Conv2d patch embedding, (1, 1, d) CLS token."""

    CONFIG_SIZES = (("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "image_size",
                     "patch_size", "num_channels"), (), ("hidden_size", "num_attention_heads"), "num_hidden_layers")

    mlp_width_field = "intermediate_size"

    # transformers < 5 names (vit.encoder.layer.L.attention.attention.query) and >= 5 names
    # (vit.layers.L.attention.q_proj): pick whichever the model has.
    LAYOUTS = (
        ("vit.encoder.layer.", {"ln1": "layernorm_before", "ln2": "layernorm_after", "attn.q": "attention.attention.query",
                                "attn.k": "attention.attention.key", "attn.v": "attention.attention.value",
                                "attn.o": "attention.output.dense", "mlp.fc1": "intermediate.dense",
                                "mlp.fc2": "output.dense"}),
        ("vit.layers.", {"ln1": "layernorm_before", "ln2": "layernorm_after", "attn.q": "attention.q_proj",
                         "attn.k": "attention.k_proj", "attn.v": "attention.v_proj", "attn.o": "attention.o_proj",
                         "mlp.fc1": "mlp.fc1", "mlp.fc2": "mlp.fc2"}),
    )

    def _layout(self, state_keys):
        for prefix, names in self.LAYOUTS:
            if f"{prefix}0.{names['attn.q']}.weight" in state_keys:
                return prefix, names
        raise UnsupportedModelError("ViTForImageClassification: unrecognised parameter layout (transformers version?)")

    def arch(self, model):
        c = model.config
        if c.hidden_act not in ("gelu", "gelu_new", "gelu_pytorch_tanh"):
            raise UnsupportedModelError(f"ViTForImageClassification hidden_act={c.hidden_act!r} is not supported")
        if getattr(model.vit, "pooler", None) is not None:
            raise UnsupportedModelError("ViT pooler module cannot be mapped (build ViTForImageClassification without it)")
        act = "gelu" if c.hidden_act == "gelu" else "gelu_tanh"
        # qkv_bias=False: the norm's shift cannot fold into q / k / v, the canonical form keeps it as beta / gamma
        return Arch("vit", c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.intermediate_size,
                    "layernorm", c.layer_norm_eps, act, qkv_bias=bool(getattr(c, "qkv_bias", True)))

    FIELDS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "layer_norm_eps",
              "hidden_act", "image_size", "patch_size", "num_channels", "num_labels", "qkv_bias")

    def config_fields(self, model):
        return {k: getattr(model.config, k, None) for k in self.FIELDS}

    def shape_fields(self, model):
        c = model.config
        return {"image_size": c.image_size, "patch_size": c.patch_size, "channels": c.num_channels,
                "num_classes": c.num_labels}

    def get(self, model):
        sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
        d = model.config.hidden_size
        e = "vit.embeddings."
        p = {"patch_embed.weight": sd[e + "patch_embeddings.projection.weight"].reshape(d, -1),
             "patch_embed.bias": sd[e + "patch_embeddings.projection.bias"],
             "cls_token": sd[e + "cls_token"].reshape(d), "pos_embed": sd[e + "position_embeddings"].reshape(-1, d)}
        prefix, names = self._layout(sd)
        for l in range(model.config.num_hidden_layers):
            for ours, theirs in names.items():
                for t in ("weight", "bias"):
                    if f"{prefix}{l}.{theirs}.{t}" in sd:  # q / k / v biases only with qkv_bias
                        p[f"blocks.{l}.{ours}.{t}"] = sd[f"{prefix}{l}.{theirs}.{t}"]
        for t in ("weight", "bias"):
            p[f"ln_f.{t}"], p[f"head.{t}"] = sd[f"vit.layernorm.{t}"], sd[f"classifier.{t}"]
        return p

    def build(self, template, params):
        model = copy.deepcopy(template)
        sd_t = model.state_dict()
        e = "vit.embeddings."
        sd = {e + "patch_embeddings.projection.weight": params["patch_embed.weight"].reshape(sd_t[e + "patch_embeddings.projection.weight"].shape),
              e + "patch_embeddings.projection.bias": params["patch_embed.bias"],
              e + "cls_token": params["cls_token"].reshape(sd_t[e + "cls_token"].shape),
              e + "position_embeddings": params["pos_embed"].reshape(sd_t[e + "position_embeddings"].shape)}
        prefix, names = self._layout(sd_t)
        for l in range(model.config.num_hidden_layers):
            for ours, theirs in names.items():
                for t in ("weight", "bias"):
                    if f"blocks.{l}.{ours}.{t}" in params:
                        sd[f"{prefix}{l}.{theirs}.{t}"] = params[f"blocks.{l}.{ours}.{t}"]
        for t in ("weight", "bias"):
            sd[f"vit.layernorm.{t}"], sd[f"classifier.{t}"] = params[f"ln_f.{t}"], params[f"head.{t}"]
        return _load(model, sd)

    def logits(self, model, inputs):
        return model(pixel_values=inputs).logits


class HFLlamaAdapter(Adapter):
    """transformers.LlamaForCausalLM, MistralForCausalLM and Qwen2ForCausalLM: one layout (separate
    q/k/v/o projections, gate/up/down MLP, RMSNorm, rotary positions), different biases and windows:
    Llama has attention_bias (q, k, v and o) and mlp_bias, Qwen2 always has q/k/v biases and maybe a
    sliding window on some layers (layer_types), Mistral has no biases and a sliding window."""

    mlp_width_field = "intermediate_size"
    MODEL_TYPES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}
    # one set of size fields; (heads, kv heads) is the divisibility grouped-query attention needs
    CONFIG_SIZES = (("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size",
                     "max_position_embeddings"), ("num_key_value_heads", "head_dim"),
                    ("num_attention_heads", "num_key_value_heads"), "num_hidden_layers")
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
        sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
        p = {"tok_embed.weight": sd["model.embed_tokens.weight"]}
        for l in range(model.config.num_hidden_layers):
            for theirs, ours in self.LAYER_NAMES:
                for t in ("weight", "bias"):
                    key = f"model.layers.{l}.{theirs}.{t}"
                    if key in sd:
                        p[f"blocks.{l}.{ours}.{t}"] = sd[key]
        p["ln_f.weight"] = sd["model.norm.weight"]
        p["lm_head.weight"] = sd.get("lm_head.weight", sd["model.embed_tokens.weight"]).clone()
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


# ---------------------------------------------------------------- the one model registry
#: our checkpoints' model_type -> (model class, config class, adapter): what `adapter_for`, `io` (save /
#: load) and the CLI (`train --model`, `--config` fields) read. A new reference model is one entry here.
REFERENCE = {"vit": (ViT, ViTConfig, RefViTAdapter), "gpt2": (GPT2, GPT2Config, RefGPT2Adapter),
             "llama": (Llama, LlamaConfig, RefLlamaAdapter)}
#: Hugging Face config.json model_type -> (transformers class name, adapter)
HUGGING_FACE = {"gpt2": ("GPT2LMHeadModel", HFGPT2Adapter), "vit": ("ViTForImageClassification", HFViTAdapter),
                **{t: (name, HFLlamaAdapter) for t, name in HFLlamaAdapter.MODEL_TYPES.items()}}


def reference_model_type(model) -> str | None:
    """Our model_type of a reference model ("vit", "gpt2", "llama"), None for any other object."""
    return next((t for t, (cls, _, _) in REFERENCE.items() if type(model) is cls or isinstance(model, cls)), None)


def adapter_for(model) -> Adapter:
    """The adapter for `model`, or a clear error naming what cannot be mapped."""
    kind = reference_model_type(model)
    if kind is not None:
        return REFERENCE[kind][2]()
    cls = type(model)
    if cls.__module__.startswith("transformers"):
        for name, adapter in HUGGING_FACE.values():
            if isinstance(model, _hf_class(name)):
                return adapter()
    supported = [f"lmc_fast.models.{c.__name__}" for c, _, _ in REFERENCE.values()]
    supported += [f"transformers.{name}" for name, _ in HUGGING_FACE.values()]
    raise UnsupportedModelError(f"cannot map module {cls.__module__}.{cls.__name__}: supported are "
                                f"{', '.join(supported[:-1])} and {supported[-1]}")


MLP_RULES = ("narrower", "any", "equal")


def check_compatible(model_a, model_b, what: str = "model_b", ref: str = "model_a", mlp: str = "narrower"):
    """Raise IncompatibleModelsError naming the first architecture field in which `model_b`
    differs from `model_a` ("model_b does not fit: patch_size is 2, model_a has 4").

    Models of one class are compared on every config field that shapes their function (GPT-2's
    tie_word_embeddings may differ); models of different supported classes on the Arch plus
    input / output sizes. The MLP width may differ as `mlp` says: "narrower" (model_b may be
    narrower: it is zero-padded, as in `align`), "any" (the caller pads every model to the
    widest, as `merge_many` does) or "equal"."""
    if mlp not in MLP_RULES:
        raise ValueError(f"mlp must be one of {MLP_RULES}, got {mlp!r}")
    ad_a, ad_b = adapter_for(model_a), adapter_for(model_b)
    if type(model_a) is type(model_b):
        fa, fb, width = ad_a.config_fields(model_a), ad_b.config_fields(model_b), ad_a.mlp_width_field
    else:
        fa, fb, width = ad_a.common_fields(model_a), ad_b.common_fields(model_b), "d_mlp"
    for key, want in fa.items():
        got = fb.get(key)
        if key != width and got != want:
            raise IncompatibleModelsError(f"{what} does not fit: {key} is {got!r}, {ref} has {want!r}")
    wa, wb = fa[width], fb[width]
    if wb == wa or mlp == "any" or (mlp == "narrower" and wb < wa):
        return
    if mlp == "narrower":
        raise IncompatibleModelsError(
            f"{what} has a wider MLP ({width} is {wb}, {ref} has {wa}): use the wider model as the reference "
            "(swap the two), or widen the reference with lmc_fast.models.pad_mlp")
    raise IncompatibleModelsError(f"{what} does not fit: {width} is {wb!r}, {ref} has {wa!r}")


def standard_params(model):
    """(Arch, standard parameters) of any supported model, with every tensor checked finite."""
    adapter = adapter_for(model)
    arch, params = adapter.arch(model), adapter.get(model)
    for name, t in params.items():
        if not all_finite(t):
            raise ValueError(f"parameter {name!r} of {type(model).__name__} holds NaN or inf values")
    return arch, params
