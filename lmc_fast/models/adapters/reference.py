"""Adapters of our reference models (lmc_fast.models): parameters already under the standard names."""
from __future__ import annotations

import copy
from dataclasses import asdict

from ..arch import Arch
from .base import Adapter, Source, _fresh_like, _load, _tied


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

    def layout(self, model):
        return {k: Source(k) for k in model.state_dict()}

    def build(self, template, params):
        return _load(copy.deepcopy(template), params)


class RefDiTAdapter(RefViTAdapter):
    """lmc_fast.models.DiT: parameters under the standard names, its fixed positions among them."""

    not_streamed = ("DiT's conditioning vector is read by every block's modulations, so no block of it can be "
                    "brought to canonical form alone")

    def layout(self, model):
        return None

    def arch(self, model):
        return model.arch()

    def logits(self, model, inputs):
        # the functional forward's layout (B, N, C p p), which the denoising metric compares with the noise
        from ..vit import patchify

        return patchify(model(inputs), model.config.patch_size)


class _RefLanguageModelAdapter(Adapter):
    """Our token models (GPT-2, Llama, NeoX, BERT): parameters already under the standard names, and
    an LM head that may be tied to the token embedding (or a classifier: BERT's sequence models)."""

    def config_fields(self, model):
        # tied or not is free: standard parameters always hold lm_head.weight, and build()
        # re-ties exactly when the two matrices come out equal
        out = asdict(model.config)
        out.pop("tie_word_embeddings", None)
        return out

    def shape_fields(self, model):
        out = {"vocab_size": model.config.vocab_size, "context": model.config.block_size}
        if getattr(model.config, "num_classes", None) is not None:
            out["num_classes"] = model.config.num_classes
        return out

    def get(self, model):
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        if hasattr(model, "lm_head"):
            state.setdefault("lm_head.weight", state["tok_embed.weight"].clone())
        return state

    def layout(self, model):
        # a tied head is stored once, as the embedding (io.py's format)
        tied = bool(getattr(model.config, "tie_word_embeddings", False))
        out = {k: Source(k) for k in model.state_dict() if not (tied and k == "lm_head.weight")}
        if hasattr(model, "lm_head") and "lm_head.weight" not in out:
            out["lm_head.weight"] = Source("tok_embed.weight")
        return out

    def build(self, template, params):
        tie = _tied(params)
        model = _fresh_like(template, tie_word_embeddings=tie)
        state = dict(params)
        if tie:
            state.pop("lm_head.weight")
        return _load(model, state)


class RefGPT2Adapter(_RefLanguageModelAdapter):
    def arch(self, model):
        c = model.config
        return Arch("gpt2", c.n_layer, c.n_embd, c.n_head, c.d_mlp, c.norm, c.eps, c.activation,
                    qkv_bias=c.qkv_bias)


class RefFunctionalAdapter(_RefLanguageModelAdapter):
    """lmc_fast.models.Llama, NeoX and Bert: models that describe their own Arch."""

    def arch(self, model):
        return model.arch()
