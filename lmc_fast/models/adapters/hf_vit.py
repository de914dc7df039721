"""transformers.ViTForImageClassification."""
from __future__ import annotations

import copy

from ..arch import Arch
from .base import Adapter, ConfigSizes, Export, Source, UnsupportedModelError, _load, from_layout


class HFViTAdapter(Adapter):
    """transformers.ViTForImageClassification: Conv2d patch embedding, (1, 1, d) CLS token."""

    CONFIG_SIZES = ConfigSizes(required=("num_hidden_layers", "hidden_size", "num_attention_heads",
                                         "intermediate_size", "image_size", "patch_size", "num_channels"),
                               optional=(), divides=("hidden_size", "num_attention_heads"), layers="num_hidden_layers")

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
        return from_layout(self.layout(model), model.state_dict())

    def layout(self, model):
        d = model.config.hidden_size
        e = "vit.embeddings."
        p = {"patch_embed.weight": Source(e + "patch_embeddings.projection.weight", lambda t: t.reshape(d, -1)),
             "patch_embed.bias": Source(e + "patch_embeddings.projection.bias"),
             "cls_token": Source(e + "cls_token", lambda t: t.reshape(d)),
             "pos_embed": Source(e + "position_embeddings", lambda t: t.reshape(-1, d))}
        state = model.state_dict()
        prefix, names = self._layout(state)
        for l in range(model.config.num_hidden_layers):
            for ours, theirs in names.items():
                for t in ("weight", "bias"):
                    if f"{prefix}{l}.{theirs}.{t}" in state:  # q / k / v biases only with qkv_bias
                        p[f"blocks.{l}.{ours}.{t}"] = Source(f"{prefix}{l}.{theirs}.{t}")
        for t in ("weight", "bias"):
            p[f"ln_f.{t}"], p[f"head.{t}"] = Source(f"vit.layernorm.{t}"), Source(f"classifier.{t}")
        return p

    def export(self, model):
        state = model.state_dict()
        out = {}
        for name, src in self.layout(model).items():
            shape = state[src.key].shape  # the conv kernel, cls token and positions: back to their own shapes
            out[src.key] = Export((name,), None if src.make is None else (lambda t, shape=shape: t.reshape(shape)))
        return out

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
