"""Adapters: every supported model class <-> one set of *standard parameters*.

Standard parameters are a flat dict named like the reference models (nn.Linear's (out, in)
layout, separate q/k/v, an explicit `lm_head.weight` for GPT-2 even when tied). Canonical
form, symmetry specs and matching are written once against these names; an adapter is the
only place that knows a concrete class (Hugging Face's Conv1D layout, fused c_attn, ...).
"""
from __future__ import annotations

from ...numerics import all_finite
from ..arch import Arch  # noqa: F401 - re-exported (modules import it from here)
from ..bert import Bert, BertConfig
from ..dit import DiT, DiTConfig
from ..gpt2 import GPT2, GPT2Config
from ..llama import Llama, LlamaConfig
from ..neox import NeoX, NeoXConfig
from ..vit import ViT, ViTConfig
from .base import Adapter, IncompatibleModelsError, UnsupportedModelError, _hf_class
from .diffusers_dit import DiffusersDiTAdapter
from .hf_bert import HFBertAdapter, HFRobertaAdapter
from .hf_gpt2 import HFGPT2Adapter
from .hf_llama import HFLlamaAdapter
from .hf_mamba import HFMambaAdapter
from .hf_neox import HFGPTNeoXAdapter
from .hf_vit import HFViTAdapter
from .reference import RefDiTAdapter, RefGPT2Adapter, RefFunctionalAdapter, RefViTAdapter


# ---------------------------------------------------------------- the one model registry
#: our checkpoints' model_type -> (model class, config class, adapter): what `adapter_for`, `io` (save /
#: load) and the CLI (`train --model`, `--config` fields) read. A new reference model is one entry here.
REFERENCE = {"vit": (ViT, ViTConfig, RefViTAdapter), "gpt2": (GPT2, GPT2Config, RefGPT2Adapter),
             "llama": (Llama, LlamaConfig, RefFunctionalAdapter), "neox": (NeoX, NeoXConfig, RefFunctionalAdapter),
             "bert": (Bert, BertConfig, RefFunctionalAdapter), "dit": (DiT, DiTConfig, RefDiTAdapter)}
#: Hugging Face config.json model_type -> (transformers class names, adapter); a folder loads as the first
#: class unless its config's "architectures" names another of them
HUGGING_FACE = {"gpt2": (("GPT2LMHeadModel",), HFGPT2Adapter), "vit": (("ViTForImageClassification",), HFViTAdapter),
                "gpt_neox": (("GPTNeoXForCausalLM",), HFGPTNeoXAdapter),
                "mamba": (("MambaForCausalLM",), HFMambaAdapter),
                "bert": (tuple(HFBertAdapter.CLASSES), HFBertAdapter),
                "roberta": (tuple(HFRobertaAdapter.CLASSES), HFRobertaAdapter),
                **{t: ((name,), HFLlamaAdapter) for t, name in HFLlamaAdapter.MODEL_TYPES.items()}}
#: diffusers class name -> adapter: models mapped in memory (io.py loads transformers folders, not diffusers ones)
DIFFUSERS = {"DiTTransformer2DModel": DiffusersDiTAdapter}


def reference_model_type(model) -> str | None:
    """Our model_type of a reference model (a REFERENCE key), None for any other object."""
    return next((t for t, (cls, _, _) in REFERENCE.items() if type(model) is cls or isinstance(model, cls)), None)


def adapter_for(model) -> Adapter:
    """The adapter for `model`, or a clear error naming what cannot be mapped."""
    kind = reference_model_type(model)
    if kind is not None:
        return REFERENCE[kind][2]()
    cls = type(model)
    if cls.__module__.startswith("transformers"):
        for names, adapter in HUGGING_FACE.values():
            if any(isinstance(model, _hf_class(name)) for name in names):
                return adapter()
    if cls.__module__.startswith("diffusers"):
        import diffusers

        for name, adapter in DIFFUSERS.items():
            if isinstance(model, getattr(diffusers, name)):
                return adapter()
    supported = [f"lmc_fast.models.{c.__name__}" for c, _, _ in REFERENCE.values()]
    supported += [f"transformers.{name}" for names, _ in HUGGING_FACE.values() for name in names]
    supported += [f"diffusers.{name}" for name in DIFFUSERS]
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
