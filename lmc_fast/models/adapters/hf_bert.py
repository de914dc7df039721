"""transformers' BERT-style encoders: BertForMaskedLM, BertForPreTraining and BertForSequenceClassification
(MultiBERTs), and RobertaForMaskedLM and RobertaForSequenceClassification.

Post-norm blocks, an embedding LayerNorm, token types (inputs are one segment: type 0, as Hugging Face
assumes when no token_type_ids are given), and a masked-LM head (transform dense + activation +
LayerNorm, a decoder tied to the word embeddings, its own bias) with, for BERT's pretraining models,
the next-sentence head (a tanh pooler and a 2-way classifier, carried and aligned beside the masked-LM
logits the library measures), or a sequence classifier (a tanh pooler on the first token, then a
linear layer). The two layouts differ in names only, and RoBERTa in its positions: they start after
its padding id (row pad + 1 of the position table), and a padding token in the inputs would get
another position, so inputs holding it are refused.
"""
from __future__ import annotations

from ..arch import Arch
from .base import (Adapter, ConfigSizes, Export, Source, UnsupportedModelError, _fresh_like, _hf_class, _load,
                   _load_lm_head, _tied, from_layout)

ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}
# (theirs under <base>.encoder.layer.L., ours under blocks.L.)
LAYER_NAMES = (("attention.self.query", "attn.q"), ("attention.self.key", "attn.k"),
               ("attention.self.value", "attn.v"), ("attention.output.dense", "attn.o"),
               ("attention.output.LayerNorm", "ln1"), ("intermediate.dense", "mlp.fc1"),
               ("output.dense", "mlp.fc2"), ("output.LayerNorm", "ln2"))
EMBEDDINGS = (("word_embeddings.weight", "tok_embed.weight"), ("position_embeddings.weight", "pos_embed"),
              ("token_type_embeddings.weight", "type_embed"), ("LayerNorm.weight", "ln_emb.weight"),
              ("LayerNorm.bias", "ln_emb.bias"))


class HFBertAdapter(Adapter):
    CONFIG_SIZES = ConfigSizes(required=("num_hidden_layers", "hidden_size", "num_attention_heads",
                                         "intermediate_size", "vocab_size", "max_position_embeddings",
                                         "type_vocab_size"),
                               optional=(), divides=("hidden_size", "num_attention_heads"), layers="num_hidden_layers")
    mlp_width_field = "intermediate_size"
    #: class name -> what it has: "mlm" (masked-LM head), "nsp" (masked LM and next-sentence head), "classify"
    CLASSES = {"BertForMaskedLM": "mlm", "BertForPreTraining": "nsp", "BertForSequenceClassification": "classify"}
    BASE = "bert"
    # the masked-LM head's transform (ours: head_dense, ln_head), decoder and bias; the pooler and classifier
    TRANSFORM = (("cls.predictions.transform.dense", "head_dense"), ("cls.predictions.transform.LayerNorm", "ln_head"))
    DECODER, DECODER_BIAS = "cls.predictions.decoder", "cls.predictions.bias"
    POOLER, CLASSIFIER, NEXT_SENTENCE = "bert.pooler.dense", "classifier", "cls.seq_relationship"
    FIELDS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size",
              "max_position_embeddings", "type_vocab_size", "layer_norm_eps", "hidden_act")

    def _kind(self, model) -> str:
        for name, kind in self.CLASSES.items():
            if isinstance(model, _hf_class(name)):
                return kind
        raise UnsupportedModelError(f"{type(model).__name__} is not one of {', '.join(self.CLASSES)}")

    def _positions(self, model) -> dict:
        """Arch fields of the position table's use (none for BERT)."""
        return {}

    def arch(self, model):
        c, kind, name = model.config, self._kind(model), type(model).__name__
        act = ACTIVATIONS.get(c.hidden_act)
        if act is None:
            raise UnsupportedModelError(f"{name} hidden_act={c.hidden_act!r} is not supported "
                                        f"(supported: {', '.join(ACTIVATIONS)})")
        if getattr(c, "is_decoder", False) or getattr(c, "add_cross_attention", False):
            raise UnsupportedModelError(f"{name} with is_decoder or add_cross_attention cannot be mapped "
                                        "(only bidirectional encoders)")
        positions = getattr(c, "position_embedding_type", "absolute")
        if positions != "absolute":
            raise UnsupportedModelError(f"{name} position_embedding_type={positions!r} is not supported "
                                        "(only 'absolute')")
        single_label = getattr(c, "problem_type", None) in (None, "single_label_classification")
        if kind == "classify" and (c.num_labels < 2 or not single_label):
            raise UnsupportedModelError(f"{name} with num_labels={c.num_labels}, problem_type={c.problem_type!r}: "
                                        "only single-label classification (num_labels >= 2) is supported")
        return Arch.bert(c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.intermediate_size,
                         eps=float(c.layer_norm_eps), activation=act, token_types=c.type_vocab_size,
                         pooling="cls" if kind == "classify" else "none", head_transform=kind != "classify",
                         pooler=kind != "mlm", **self._positions(model))

    def config_fields(self, model):
        self.arch(model)  # refuses what cannot be mapped
        out = {k: getattr(model.config, k, None) for k in self.FIELDS}
        out["num_labels"] = model.config.num_labels if self._kind(model) == "classify" else None
        out["next_sentence_head"] = self._kind(model) == "nsp"
        return out

    def shape_fields(self, model):
        a = self.arch(model)
        out = {"vocab_size": model.config.vocab_size, "context": model.config.max_position_embeddings - a.position_offset}
        if self._kind(model) == "classify":
            out["num_classes"] = model.config.num_labels
        return out

    def _heads(self, kind: str) -> list[tuple[str, str]]:
        """(theirs, ours) of the head's linear layers and norms beside the decoder."""
        if kind == "classify":
            return [(self.POOLER, "pooler"), (self.CLASSIFIER, "head")]
        return list(self.TRANSFORM) + ([(self.POOLER, "pooler"), (self.NEXT_SENTENCE, "nsp")] if kind == "nsp" else [])

    def get(self, model):
        return from_layout(self.layout(model), model.state_dict())

    def layout(self, model):
        kind, base = self._kind(model), self.BASE
        p = {ours: Source(f"{base}.embeddings.{theirs}") for theirs, ours in EMBEDDINGS}
        for l in range(model.config.num_hidden_layers):
            for theirs, ours in LAYER_NAMES:
                for t in ("weight", "bias"):
                    p[f"blocks.{l}.{ours}.{t}"] = Source(f"{base}.encoder.layer.{l}.{theirs}.{t}")
        for theirs, ours in self._heads(kind):
            for t in ("weight", "bias"):
                p[f"{ours}.{t}"] = Source(f"{theirs}.{t}")
        if kind != "classify":
            tied = getattr(model.config, "tie_word_embeddings", True)
            # a tied decoder is stored once, as the embedding, and its bias as the head's bias; an untied
            # one has its own weight and the bias the forward adds (the head's is left unused)
            p["lm_head.weight"] = Source(p["tok_embed.weight"].key if tied else self.DECODER + ".weight")
            p["lm_head.bias"] = Source(self.DECODER_BIAS if tied else self.DECODER + ".bias")
        return p

    def export(self, model):
        layout, state = self.layout(model), model.state_dict()
        out = {src.key: Export((name,)) for name, src in layout.items() if not name.startswith("lm_head.")}
        if "lm_head.weight" in layout:  # the decoder written untied, its bias under both names the module has
            out[self.DECODER + ".weight"] = Export(("lm_head.weight",))
            out[self.DECODER_BIAS] = Export(("lm_head.bias",))
            if self.DECODER + ".bias" in state:
                out[self.DECODER + ".bias"] = Export(("lm_head.bias",))
        return out

    def build(self, template, params):
        kind, base = self._kind(template), self.BASE
        tie = kind != "classify" and _tied(params)
        model = _fresh_like(template, tie_word_embeddings=tie) if kind != "classify" else _fresh_like(template)
        sd = {f"{base}.embeddings.{theirs}": params[ours] for theirs, ours in EMBEDDINGS}
        for l in range(model.config.num_hidden_layers):
            for theirs, ours in LAYER_NAMES:
                for t in ("weight", "bias"):
                    sd[f"{base}.encoder.layer.{l}.{theirs}.{t}"] = params[f"blocks.{l}.{ours}.{t}"]
        for theirs, ours in self._heads(kind):
            for t in ("weight", "bias"):
                sd[f"{theirs}.{t}"] = params[f"{ours}.{t}"]
        if kind == "classify":
            return _load(model, sd)
        sd[self.DECODER_BIAS] = params["lm_head.bias"]
        if self.DECODER + ".bias" in model.state_dict():  # the same bias, tied in the module
            sd[self.DECODER + ".bias"] = params["lm_head.bias"]
        return _load_lm_head(model, sd, params, tie, head_key=self.DECODER + ".weight")

    def logits(self, model, inputs):
        out = model(input_ids=inputs)
        return out.prediction_logits if self._kind(model) == "nsp" else out.logits


class HFRobertaAdapter(HFBertAdapter):
    """RoBERTa: BERT's layout under other names; positions start at row pad + 1, and its masked-LM head's
    activation is always the exact GELU."""

    CLASSES = {"RobertaForMaskedLM": "mlm", "RobertaForSequenceClassification": "classify"}
    BASE = "roberta"
    TRANSFORM = (("lm_head.dense", "head_dense"), ("lm_head.layer_norm", "ln_head"))
    DECODER, DECODER_BIAS = "lm_head.decoder", "lm_head.bias"
    POOLER, CLASSIFIER, NEXT_SENTENCE = "classifier.dense", "classifier.out_proj", None

    def _positions(self, model) -> dict:
        pad = model.config.pad_token_id
        if not isinstance(pad, int) or not 0 <= pad < model.config.max_position_embeddings - 1:
            raise UnsupportedModelError(f"{type(model).__name__} pad_token_id={pad!r}: positions start after the "
                                        "padding id, which must be an id below max_position_embeddings - 1")
        return {"position_offset": pad + 1, "reserved_token": pad}

    def arch(self, model):
        if self._kind(model) == "mlm" and model.config.hidden_act != "gelu":
            # RobertaLMHead applies the exact GELU whatever hidden_act says; one activation is mapped
            raise UnsupportedModelError(f"RobertaForMaskedLM hidden_act={model.config.hidden_act!r} is not supported "
                                        "(its masked-LM head uses 'gelu'; only 'gelu' models are mapped)")
        return super().arch(model)
