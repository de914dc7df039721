"""The adapter base class and the helpers every adapter shares (docs/ARCHITECTURE.md, section 8).

An adapter maps one model class to standard parameters (lmc_fast/models/arch.py: one naming,
nn.Linear's (out, in) layout) and back; it is the only code that knows a concrete class.
"""
from __future__ import annotations

import copy
from dataclasses import asdict
from typing import NamedTuple

import torch
from torch import nn

from ..arch import Arch


class UnsupportedModelError(TypeError):
    """The model (or one of its modules/settings) has no adapter."""


class IncompatibleModelsError(ValueError):
    """Two models that cannot be combined: an architecture field differs."""


class ConfigSizes(NamedTuple):
    """The config.json fields io.py checks before building a Hugging Face model: `required` positive
    sizes, `optional` ones (absent or None allowed), a (width, heads) pair that must divide, and the
    field counting the layers (checked against the weight files)."""

    required: tuple
    optional: tuple
    divides: tuple
    layers: str


class Source(NamedTuple):
    """Where one standard parameter comes from in the class's state dict: its key there and, for a
    layout other than (out, in), the map from that tensor to the standard one (None: the tensor as
    stored; only tensors stored as they are can be read a block of rows at a time)."""

    key: str
    make: object = None


class Export(NamedTuple):
    """How one tensor of the class's state dict is made from standard parameters: their names and the map
    (None: the one parameter as it is; a map takes the named parameters whole)."""

    names: tuple
    make: object = None


class Adapter:
    """Maps one model class to standard parameters and back."""

    #: The config attribute holding the MLP width (for `resized`).
    mlp_width_field = "d_mlp"
    #: why `layout` is None, where it is (the streamed reader's refusal says it)
    not_streamed = "its standard parameters are cut from fused tensors"

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

    def layout(self, model) -> dict[str, Source] | None:
        """Each standard parameter's Source in the class's state dict (streamed checkpoints read them one
        at a time); None for a class that cannot be read that way (it loads whole)."""
        return None

    def export(self, model) -> dict[str, Export] | None:
        """Each state-dict tensor a streamed write makes, from standard parameters, the LM head under a key
        of its own (an aligned head differs from the embedding). Default: the layout read backwards, for
        layouts of renamed tensors."""
        layout = self.layout(model)
        if layout is None or any(src.make is not None for src in layout.values()):
            return None
        out = {}
        for name, src in layout.items():
            key = src.key if src.key not in out else "lm_head.weight"  # the tied head, read from the embedding
            out[key] = Export((name,))
        return out

    def build(self, template, params: dict[str, torch.Tensor]):
        """A new model of the template's class, dtype and device holding `params`."""
        raise NotImplementedError

    def logits(self, model, inputs):
        return model(inputs)


def from_layout(layout: dict[str, Source], state: dict) -> dict[str, torch.Tensor]:
    """Standard parameters (detached clones) from a state dict by its layout."""
    out = {}
    for name, src in layout.items():
        t = state[src.key].detach()
        out[name] = t.clone() if src.make is None else src.make(t).contiguous().clone()
    return out


def _tied(params) -> bool:
    """Whether the LM head equals the token embedding (False for models without an LM head)."""
    if "lm_head.weight" not in params:
        return False
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


def _load_lm_head(model: nn.Module, state: dict, params: dict, tie: bool, head_key: str = "lm_head.weight") -> nn.Module:
    """Load a Hugging Face language model's state, its head (`head_key`) either tied to the embedding or its own."""
    if not tie:
        state[head_key] = params["lm_head.weight"]
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


def _hf_class(name: str):
    import transformers

    return getattr(transformers, name)
