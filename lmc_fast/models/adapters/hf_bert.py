"""transformers.BertForMaskedLM, BertForPreTraining and BertForSequenceClassification (MultiBERTs):
post-norm blocks, an embedding LayerNorm, token types (inputs are one segment: type 0, as Hugging Face
assumes when no token_type_ids are given), and BERT's masked-LM head (transform dense + activation +
LayerNorm, a decoder tied to the word embeddings, its own bias), with the pretraining models'
next-sentence head (a tanh pooler and a 2-way classifier, carried and aligned beside the masked-LM
logits the library measures), or a sequence classifier's pooler and classifier."""
from __future__ import annotations

from ..arch import Arch
from .base import (Adapter, ConfigSizes, UnsupportedModelError, _fresh_like, _hf_class, _load, _load_lm_head,
                   _tied)

ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}


class HFBertAdapter(Adapter):
    CONFIG_SIZES = ConfigSizes(required=("num_hidden_layers", "hidden_size", "num_attention_heads",
                                         "intermediate_size", "vocab_size", "max_position_embeddings",
                                         "type_vocab_size"),
                               optional=(), divides=("hidden_size", "num_attention_heads"), layers="num_hidden_layers")
    mlp_width_field = "intermediate_size"
    CLASSES = ("BertForMaskedLM", "BertForPreTraining", "BertForSequenceClassification")
    # (theirs under bert.encoder.layer.L., ours under blocks.L.)
    LAYER_NAMES = (("attention.self.query", "attn.q"), ("attention.self.key", "attn.k"),
                   ("attention.self.value", "attn.v"), ("attention.output.dense", "attn.o"),
                   ("attention.output.LayerNorm", "ln1"), ("intermediate.dense", "mlp.fc1"),
                   ("output.dense", "mlp.fc2"), ("output.LayerNorm", "ln2"))
    EMBEDDINGS = (("word_embeddings.weight", "tok_embed.weight"), ("position_embeddings.weight", "pos_embed"),
                  ("token_type_embeddings.weight", "type_embed"), ("LayerNorm.weight", "ln_emb.weight"),
                  ("LayerNorm.bias", "ln_emb.bias"))
    MLM_HEAD = (("cls.predictions.transform.dense", "head_dense"), ("cls.predictions.transform.LayerNorm", "ln_head"))
    FIELDS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size",
              "max_position_embeddings", "type_vocab_size", "layer_norm_eps", "hidden_act")

    def _kind(self, model) -> str:
        for name in self.CLASSES:
            if isinstance(model, _hf_class(name)):
                return name
        raise UnsupportedModelError(f"{type(model).__name__} is not one of {', '.join(self.CLASSES)}")

    def _masked_lm(self, model) -> bool:
        return self._kind(model) != "BertForSequenceClassification"

    def _nsp(self, model) -> bool:
        """A pretraining model: the masked LM with the next-sentence head."""
        return self._kind(model) == "BertForPreTraining"

    def arch(self, model):
        c, kind = model.config, self._kind(model)
        act = ACTIVATIONS.get(c.hidden_act)
        if act is None:
            raise UnsupportedModelError(f"{kind} hidden_act={c.hidden_act!r} is not supported "
                                        f"(supported: {', '.join(ACTIVATIONS)})")
        if getattr(c, "is_decoder", False) or getattr(c, "add_cross_attention", False):
            raise UnsupportedModelError(f"{kind} with is_decoder or add_cross_attention cannot be mapped "
                                        "(only bidirectional encoders)")
        positions = getattr(c, "position_embedding_type", "absolute")
        if positions != "absolute":
            raise UnsupportedModelError(f"{kind} position_embedding_type={positions!r} is not supported "
                                        "(only 'absolute')")
        masked = kind != "BertForSequenceClassification"
        single_label = getattr(c, "problem_type", None) in (None, "single_label_classification")
        if not masked and (c.num_labels < 2 or not single_label):
            raise UnsupportedModelError(f"{kind} with num_labels={c.num_labels}, problem_type={c.problem_type!r}: "
                                        "only single-label classification (num_labels >= 2) is supported")
        return Arch.bert(c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.intermediate_size,
                         eps=float(c.layer_norm_eps), activation=act, token_types=c.type_vocab_size,
                         pooling="none" if masked else "cls", head_transform=masked,
                         pooler=kind != "BertForMaskedLM")

    def config_fields(self, model):
        self.arch(model)  # refuses what cannot be mapped
        out = {k: getattr(model.config, k, None) for k in self.FIELDS}
        out["num_labels"] = None if self._masked_lm(model) else model.config.num_labels
        out["next_sentence_head"] = self._nsp(model)
        return out

    def shape_fields(self, model):
        out = {"vocab_size": model.config.vocab_size, "context": model.config.max_position_embeddings}
        if not self._masked_lm(model):
            out["num_classes"] = model.config.num_labels
        return out

    def get(self, model):
        sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
        p = {ours: sd["bert.embeddings." + theirs] for theirs, ours in self.EMBEDDINGS}
        for l in range(model.config.num_hidden_layers):
            for theirs, ours in self.LAYER_NAMES:
                for t in ("weight", "bias"):
                    p[f"blocks.{l}.{ours}.{t}"] = sd[f"bert.encoder.layer.{l}.{theirs}.{t}"]
        if self._masked_lm(model):
            for theirs, ours in self.MLM_HEAD:
                for t in ("weight", "bias"):
                    p[f"{ours}.{t}"] = sd[f"{theirs}.{t}"]
            p["lm_head.weight"] = sd.get("cls.predictions.decoder.weight", p["tok_embed.weight"]).clone()
            # the decoder's own bias is what the forward adds (tied to cls.predictions.bias unless the
            # config unties the head, where cls.predictions.bias is left unused)
            p["lm_head.bias"] = sd.get("cls.predictions.decoder.bias", sd["cls.predictions.bias"])
            if self._nsp(model):
                for t in ("weight", "bias"):
                    p[f"pooler.{t}"], p[f"nsp.{t}"] = sd[f"bert.pooler.dense.{t}"], sd[f"cls.seq_relationship.{t}"]
        else:
            for t in ("weight", "bias"):
                p[f"pooler.{t}"], p[f"head.{t}"] = sd[f"bert.pooler.dense.{t}"], sd[f"classifier.{t}"]
        return p

    def build(self, template, params):
        masked = self._masked_lm(template)
        tie = masked and _tied(params)
        model = _fresh_like(template, tie_word_embeddings=tie) if masked else _fresh_like(template)
        sd = {"bert.embeddings." + theirs: params[ours] for theirs, ours in self.EMBEDDINGS}
        for l in range(model.config.num_hidden_layers):
            for theirs, ours in self.LAYER_NAMES:
                for t in ("weight", "bias"):
                    sd[f"bert.encoder.layer.{l}.{theirs}.{t}"] = params[f"blocks.{l}.{ours}.{t}"]
        if not masked:
            for t in ("weight", "bias"):
                sd[f"bert.pooler.dense.{t}"], sd[f"classifier.{t}"] = params[f"pooler.{t}"], params[f"head.{t}"]
            return _load(model, sd)
        for theirs, ours in self.MLM_HEAD:
            for t in ("weight", "bias"):
                sd[f"{theirs}.{t}"] = params[f"{ours}.{t}"]
        sd["cls.predictions.bias"] = params["lm_head.bias"]
        if self._nsp(template):
            for t in ("weight", "bias"):
                sd[f"bert.pooler.dense.{t}"] = params[f"pooler.{t}"]
                sd[f"cls.seq_relationship.{t}"] = params[f"nsp.{t}"]
        if "cls.predictions.decoder.bias" in model.state_dict():  # the same bias, tied in the module
            sd["cls.predictions.decoder.bias"] = params["lm_head.bias"]
        return _load_lm_head(model, sd, params, tie, head_key="cls.predictions.decoder.weight")

    def logits(self, model, inputs):
        out = model(input_ids=inputs)
        return out.prediction_logits if self._nsp(model) else out.logits
