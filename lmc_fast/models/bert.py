"""Reference BERT (MultiBERTs' architecture): post-norm blocks (the LayerNorms sit on the residual stream,
after each addition), learned positions and token types with an embedding LayerNorm, bidirectional
attention, and either BERT's masked-LM head (dense, activation, LayerNorm, a decoder tied to the token
embedding, with its own bias) or its sequence classifier (tanh pooler on the first token, then a linear
layer).

The modules only hold the parameters, under the standard names (lmc_fast/models/arch.py); the forward
pass is the library's one functional forward (lmc_fast/models/functional.py) run with K = 1, so this
model, Hugging Face's BertForMaskedLM / BertForSequenceClassification and every sweep compute the same
function.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional

import torch
from torch import nn

from .arch import Arch
from .blocks import Norm, init_weights, require_choice, require_eps, require_param_limit, require_positive_int
from .functional_lm import FunctionalLanguageModel

SIZE_FIELDS = ("n_layer", "d_model", "n_head", "vocab_size", "block_size", "type_vocab_size")
ACTIVATIONS = ("gelu", "gelu_tanh")


@dataclass
class BertConfig:
    n_layer: int = 2
    d_model: int = 64
    n_head: int = 4
    d_mlp: Optional[int] = None  # default 4 * d_model (BERT's intermediate_size)
    vocab_size: int = 257  # byte-level text plus one [MASK] id (256)
    block_size: int = 64  # learned positions: the longest input
    type_vocab_size: int = 2
    eps: float = 1e-12
    activation: str = "gelu"
    num_classes: Optional[int] = None  # None: masked-LM head; else a sequence classifier with this many classes
    tie_word_embeddings: bool = True  # the masked-LM decoder shares the token embedding

    def __post_init__(self):
        # everything checked before a Bert allocates a tensor: one line naming the field
        for name in SIZE_FIELDS:
            require_positive_int("BertConfig", name, getattr(self, name))
        if self.d_mlp is None:
            self.d_mlp = 4 * self.d_model
        require_positive_int("BertConfig", "d_mlp", self.d_mlp)
        if self.d_model % self.n_head:
            raise ValueError(f"BertConfig.d_model={self.d_model} is not divisible by n_head={self.n_head}")
        if self.num_classes is not None:
            require_positive_int("BertConfig", "num_classes", self.num_classes)
        require_eps("BertConfig", self.eps)
        require_choice("BertConfig", "activation", self.activation, ACTIVATIONS)
        if not isinstance(self.tie_word_embeddings, bool):
            raise ValueError(f"BertConfig.tie_word_embeddings must be true or false, got {self.tie_word_embeddings!r}")
        require_param_limit("BertConfig", self.param_count(),
                            f"n_layer={self.n_layer}, d_model={self.d_model}, d_mlp={self.d_mlp}, "
                            f"vocab_size={self.vocab_size}, block_size={self.block_size}")

    @property
    def masked_lm(self) -> bool:
        return self.num_classes is None

    def param_count(self) -> int:
        """Exactly the parameters `Bert(self)` allocates (a tied decoder counted once)."""
        d, f, V = self.d_model, self.d_mlp, self.vocab_size
        embed = V * d + self.block_size * d + self.type_vocab_size * d + 2 * d
        block = 4 * d * d + 4 * d + d * f + f + f * d + d + 4 * d
        if self.masked_lm:
            head = d * d + d + 2 * d + V + (0 if self.tie_word_embeddings else V * d)
        else:
            head = d * d + d + self.num_classes * (d + 1)
        return embed + self.n_layer * block + head

    def to_dict(self) -> dict:
        return asdict(self)


class BertAttention(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(c.d_model, c.d_model) for _ in range(4))


class BertMLP(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.fc1 = nn.Linear(c.d_model, c.d_mlp)
        self.fc2 = nn.Linear(c.d_mlp, c.d_model)


class BertBlock(nn.Module):
    """ln1 normalises the stream after attention is added, ln2 after the MLP (post-norm)."""

    def __init__(self, c: BertConfig):
        super().__init__()
        self.attn = BertAttention(c)
        self.ln1 = Norm(c.d_model, "layernorm", c.eps)
        self.mlp = BertMLP(c)
        self.ln2 = Norm(c.d_model, "layernorm", c.eps)


class Bert(FunctionalLanguageModel):
    def __init__(self, config: BertConfig):
        super().__init__()
        c = self.config = config
        self.tok_embed = nn.Embedding(c.vocab_size, c.d_model)
        self.pos_embed = nn.Parameter(torch.zeros(c.block_size, c.d_model))
        self.type_embed = nn.Parameter(torch.zeros(c.type_vocab_size, c.d_model))
        self.ln_emb = Norm(c.d_model, "layernorm", c.eps)
        self.blocks = nn.ModuleList(BertBlock(c) for _ in range(c.n_layer))
        if c.masked_lm:
            self.head_dense = nn.Linear(c.d_model, c.d_model)
            self.ln_head = Norm(c.d_model, "layernorm", c.eps)
            self.lm_head = nn.Linear(c.d_model, c.vocab_size)
        else:
            self.pooler = nn.Linear(c.d_model, c.d_model)
            self.head = nn.Linear(c.d_model, c.num_classes)
        init_weights(self)
        if c.masked_lm and c.tie_word_embeddings:
            self.lm_head.weight = self.tok_embed.weight

    def arch(self) -> Arch:
        c = self.config
        return Arch.bert(c.n_layer, c.d_model, c.n_head, c.d_mlp, eps=float(c.eps), activation=c.activation,
                         token_types=c.type_vocab_size, pooling="none" if c.masked_lm else "cls",
                         head_transform=c.masked_lm, pooler=not c.masked_lm)
