"""One description of a Transformer for everything after the adapters (docs/ARCHITECTURE.md, section 8).

The canonical form, the symmetry specs, the functional forward and the checks read the explicit
fields below; none of them branches on `family`, which is only a label (messages, files).
`Arch.vit`, `Arch.gpt2` and `Arch.llama` give each family's settings; a new architecture is an
adapter that fills these fields, not a new branch in five files.

Standard parameter names (nn.Linear's (out, in) layout):
    inputs "patches": patch_embed.weight / .bias, cls_token, pos_embed
    inputs "tokens":  tok_embed.weight, pos_embed (positions "learned" only), type_embed (token_types > 0:
        BERT's token-type rows; inputs are one segment, type 0), ln_emb (embed_norm: BERT's embedding norm)
    blocks.L.ln1 / ln2 (.weight, .bias for LayerNorm): pre-norm: ln1 feeds attention, ln2 the MLP;
        post-norm: ln1 normalises the stream after attention is added, ln2 after the MLP
    blocks.L.attn.q / k / v / o (.weight, .bias where the arch has them); k and v have
        n_kv_head * head_dim rows (grouped-query attention), q has n_head * head_dim
    blocks.L.mlp.fc1 (up), mlp.gate (gated MLPs only: act(gate x) * fc1 x), mlp.fc2 (down)
    ln_f (pre-norm only), pooler (pooler: tanh(pooler h_cls), read by the classifier `head` of BERT's
        sequence classifiers, or by `nsp`, the next-sentence head of BERT's pretraining models),
    head_dense and ln_head (head_transform: BERT's masked-LM transform ln_head(act(head_dense h))),
    then `head` (classifier, pooled "cls") or `lm_head` (per token, pooling "none")
    mixer "mamba" (models/mamba.py; blocks.L.ln1 the block's RMSNorm, no attention or MLP): blocks.L.mamba.
        in_x / in_z (.weight (d_inner, d), .bias with proj_bias: Hugging Face's in_proj cut in its x and gate
        rows), conv (.weight (d_inner, d_conv): the depthwise causal conv, .bias with conv_bias), x_dt / x_B /
        x_C (.weight (dt_rank | d_state | d_state, d_inner): x_proj cut in its rows), dt (.weight
        (d_inner, dt_rank), .bias), A_log (d_inner, d_state), D (d_inner), out (.weight (d, d_inner), .bias
        with proj_bias); d_mlp is d_inner
    conditioning "adaln" (DiT, models/functional_dit.py): patch_embed and pos_embed (no cls_token), t_embed.fc1 /
        fc2 (the timestep MLP), y_embed.weight (class rows, the last one the null class), per block
        blocks.L.mod.{shift1, scale1, gate1, shift2, scale2, gate2} (.weight, .bias: each a linear map of silu(c)),
        attn and mlp as above with no norm parameters, final.shift / final.scale, then `out` (patch pixels, rows in
        patchify's (C, p, p) order; with learn_sigma the C noise channels' rows, then C variance channels')
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields

FAMILIES = ("vit", "gpt2", "llama", "neox", "bert", "dit", "mamba")
NORMS = ("layernorm", "rmsnorm")
ACTIVATIONS = ("gelu", "gelu_tanh", "silu")
INPUTS = ("patches", "tokens")
POSITIONS = ("learned", "rotary")
POOLINGS = ("cls", "none")
MLPS = ("plain", "gated")
#: how a block adds into the residual stream: "sequential" h += attn(ln1 h); h += mlp(ln2 h)
#: "parallel" (GPT-NeoX, GPT-J) h += attn(ln1 h) + mlp(ln2 h), both norms reading the same h
#: "post" (BERT) h = ln1(h + attn h); h = ln2(h + mlp h): the norms sit on the stream itself
RESIDUALS = ("sequential", "parallel", "post")
#: how a conditioning vector c enters the blocks: "adaln" (DiT's adaLN-Zero): per-channel shift, scale and gate
#: of each branch made from silu(c); None: unconditioned
CONDITIONINGS = ("adaln",)
#: what mixes the tokens in a block: "attention" (attention and an MLP) | "mamba" (Mamba's selective scan alone:
#: h += mamba(ln1 h))
MIXERS = ("attention", "mamba")
# Bound on any size in an Arch read from a file: larger values only come from corrupt headers.
MAX_SIZE = 1 << 20

# what each family's fields are when a file or a caller names only the first eight
_FAMILY_DEFAULTS = {
    "vit": dict(inputs="patches", positions="learned", causal=False, pooling="cls", mlp="plain", qkv_bias=True,
                o_bias=True, mlp_bias=True, head_bias=True),
    "gpt2": dict(inputs="tokens", positions="learned", causal=True, pooling="none", mlp="plain", qkv_bias=True,
                 o_bias=True, mlp_bias=True, head_bias=False),
    "llama": dict(inputs="tokens", positions="rotary", causal=True, pooling="none", mlp="gated", qkv_bias=False,
                  o_bias=False, mlp_bias=False, head_bias=False),
    "neox": dict(inputs="tokens", positions="rotary", causal=True, pooling="none", mlp="plain", qkv_bias=True,
                 o_bias=True, mlp_bias=True, head_bias=False, residual="parallel"),
    "bert": dict(inputs="tokens", positions="learned", causal=False, pooling="none", mlp="plain", qkv_bias=True,
                 o_bias=True, mlp_bias=True, head_bias=True, residual="post", embed_norm=True, head_transform=True),
    "dit": dict(inputs="patches", positions="learned", causal=False, pooling="none", mlp="plain", qkv_bias=True,
                o_bias=True, mlp_bias=True, head_bias=True, conditioning="adaln"),
    "mamba": dict(inputs="tokens", causal=True, pooling="none", mlp="plain", qkv_bias=False, o_bias=False,
                  mlp_bias=False, head_bias=False, mixer="mamba"),
}


@dataclass(frozen=True)
class Arch:
    """What the symmetry code needs to know about a model, independent of its class."""

    family: str  # a label: "vit" | "gpt2" | "llama" (defaults for the fields left None)
    n_layer: int
    d_model: int
    n_head: int
    d_mlp: int
    norm: str  # "layernorm" | "rmsnorm"
    eps: float
    activation: str  # "gelu" | "gelu_tanh" | "silu"
    n_kv_head: int | None = None  # grouped-query attention: key / value heads (None: n_head)
    head_dim: int | None = None  # None: d_model // n_head
    inputs: str | None = None  # "patches" (images) | "tokens"
    positions: str | None = None  # "learned" (pos_embed added) | "rotary" (RoPE on q and k)
    rope_theta: float = 10000.0
    window: int | None = None  # sliding-window attention: a query sees the last `window` keys
    causal: bool | None = None
    pooling: str | None = None  # "cls": classify token 0 | "none": logits per token
    mlp: str | None = None  # "plain": fc2(act(fc1 x)) | "gated": fc2(act(gate x) * fc1 x)
    qkv_bias: bool | None = None
    o_bias: bool | None = None
    mlp_bias: bool | None = None
    head_bias: bool | None = None
    residual: str | None = None  # "sequential" | "parallel" (RESIDUALS)
    rotary_dim: int | None = None  # rotary positions on the first rotary_dim dims of each head (None: all)
    token_types: int = 0  # rows of type_embed (BERT's token types); 0: none
    embed_norm: bool | None = None  # a norm (ln_emb) on the embeddings' sum
    head_transform: bool | None = None  # BERT's masked-LM transform before the head
    pooler: bool = False  # tanh(pooler h_cls): BERT's sequence classifiers and next-sentence head
    # attention logits q.k / sqrt(head_dim) (scale_attn), further / (layer + 1) (scale_by_layer: GPT-2's
    # scale_attn_by_inverse_layer_idx, which Stanford CRFM's GPT-2 seed suites use)
    scale_attn: bool = True
    scale_by_layer: bool = False
    # learned positions from row position_offset of pos_embed on (RoBERTa: its padding id + 1); a token id the
    # inputs must not hold (RoBERTa's padding id, whose positions its model computes apart)
    position_offset: int = 0
    reserved_token: int | None = None
    # DiT: the conditioning (CONDITIONINGS) and the width of the timestep's sinusoidal features (0: none)
    conditioning: str | None = None
    freq_dim: int = 0
    # Mamba (MIXERS): the state size, the rank of dt's projection, the conv's width, whether the conv and
    # in / out projections have biases (d_inner is d_mlp)
    mixer: str | None = None
    d_state: int = 0
    dt_rank: int = 0
    d_conv: int = 0
    conv_bias: bool = False
    proj_bias: bool = False
    # DiT as diffusers writes it (models/adapters/diffusers_dit.py; DiT's own code keeps the defaults): the timestep
    # features' frequencies 10000^(-i / (freq_dim / 2 - freq_shift)) (diffusers' downscale_freq_shift, 1 there), the
    # epsilon of the MLP branch's norm where it is not eps (diffusers' norm_eps; None: eps), and learn_sigma: `out`
    # holds the noise rows, then as many variance rows, which read the stream too but which the task does not score
    freq_shift: int = 0
    mlp_eps: float | None = None
    learn_sigma: bool = False

    def __post_init__(self):
        defaults = _FAMILY_DEFAULTS.get(self.family, {})
        for name, value in defaults.items():
            if getattr(self, name) is None:
                object.__setattr__(self, name, value)
        if self.n_kv_head is None:
            object.__setattr__(self, "n_kv_head", self.n_head)
        if self.head_dim is None:
            object.__setattr__(self, "head_dim", self.d_model // self.n_head if self.n_head else 0)
        if self.residual is None:
            object.__setattr__(self, "residual", "sequential")
        if self.mixer is None:
            object.__setattr__(self, "mixer", "attention")
        if self.rotary_dim is None:
            object.__setattr__(self, "rotary_dim", self.head_dim if self.positions == "rotary" else 0)
        for name in ("embed_norm", "head_transform"):
            if getattr(self, name) is None:
                object.__setattr__(self, name, False)

    # ---- derived
    @property
    def d_head(self) -> int:
        return self.head_dim

    @property
    def group_size(self) -> int:
        """Query heads per key / value head (1 without grouped-query attention)."""
        return self.n_head // self.n_kv_head

    @property
    def rotary(self) -> bool:
        return self.positions == "rotary"

    @property
    def parallel(self) -> bool:
        return self.residual == "parallel"

    @property
    def post_norm(self) -> bool:
        """The norms sit on the residual stream (BERT): nothing folds across them, rotations of the
        stream are not symmetries (per-channel scales do not commute with them), permutations are."""
        return self.residual == "post"

    @property
    def gated(self) -> bool:
        return self.mlp == "gated"

    @property
    def mamba(self) -> bool:
        """Mamba blocks (h += mamba(ln1 h)): no attention, no MLP; d_mlp is the inner width d_inner."""
        return self.mixer == "mamba"

    @property
    def d_inner(self) -> int:
        return self.d_mlp

    @property
    def conditioned(self) -> bool:
        """DiT: blocks modulated by a conditioning vector (adaLN-Zero); the output is an image, not logits."""
        return self.conditioning is not None

    @property
    def head_name(self) -> str:
        if self.conditioned:
            return "out"
        return "head" if self.pooling == "cls" else "lm_head"

    @property
    def head_has_bias(self) -> bool:
        return bool(self.head_bias)

    @property
    def pooler_head(self) -> str:
        """What reads the pooler: the classifier (pooling "cls") or BERT's next-sentence head "nsp", which
        a masked LM carries beside its logits (the library measures the masked-token logits)."""
        return "head" if self.pooling == "cls" else "nsp"

    def attn_scale(self, layer: int) -> float:
        """The factor on block `layer`'s attention logits q . k."""
        scale = self.head_dim ** -0.5 if self.scale_attn else 1.0
        return scale / (layer + 1) if self.scale_by_layer else scale

    def attn_params(self, layer: int) -> list[str]:
        """The attention parameters of block `layer` this architecture has."""
        b = f"blocks.{layer}.attn."
        out = [b + n + ".weight" for n in "qkvo"]
        if self.qkv_bias:
            out += [b + n + ".bias" for n in "qkv"]
        if self.o_bias:
            out.append(b + "o.bias")
        return out

    def mlp_readers(self, layer: int) -> list[str]:
        """The MLP's input layers (the norm ln2 feeds them): up, and gate for gated MLPs."""
        b = f"blocks.{layer}.mlp."
        return [b + "fc1"] + ([b + "gate"] if self.gated else [])

    # ---- constructors
    @classmethod
    def vit(cls, n_layer, d_model, n_head, d_mlp, norm="layernorm", eps=1e-5, activation="gelu", **kw) -> "Arch":
        return cls("vit", n_layer, d_model, n_head, d_mlp, norm, eps, activation, **kw)

    @classmethod
    def gpt2(cls, n_layer, d_model, n_head, d_mlp, norm="layernorm", eps=1e-5, activation="gelu_tanh",
             **kw) -> "Arch":
        return cls("gpt2", n_layer, d_model, n_head, d_mlp, norm, eps, activation, **kw)

    @classmethod
    def llama(cls, n_layer, d_model, n_head, d_mlp, n_kv_head=None, eps=1e-6, **kw) -> "Arch":
        return cls("llama", n_layer, d_model, n_head, d_mlp, "rmsnorm", eps, "silu", n_kv_head=n_kv_head, **kw)

    @classmethod
    def neox(cls, n_layer, d_model, n_head, d_mlp, eps=1e-5, activation="gelu", **kw) -> "Arch":
        return cls("neox", n_layer, d_model, n_head, d_mlp, "layernorm", eps, activation, **kw)

    @classmethod
    def dit(cls, n_layer, d_model, n_head, d_mlp, freq_dim, eps=1e-6, activation="gelu_tanh", **kw) -> "Arch":
        return cls("dit", n_layer, d_model, n_head, d_mlp, "layernorm", eps, activation, freq_dim=freq_dim, **kw)

    @classmethod
    def mamba_lm(cls, n_layer, d_model, d_inner, d_state, dt_rank, d_conv, eps=1e-5, activation="silu",
                 **kw) -> "Arch":
        """Mamba (n_head is 1: no heads)."""
        return cls("mamba", n_layer, d_model, 1, d_inner, "rmsnorm", eps, activation, d_state=d_state,
                   dt_rank=dt_rank, d_conv=d_conv, **kw)

    @classmethod
    def bert(cls, n_layer, d_model, n_head, d_mlp, eps=1e-12, activation="gelu", **kw) -> "Arch":
        return cls("bert", n_layer, d_model, n_head, d_mlp, "layernorm", eps, activation, **kw)

    # ---- files
    @classmethod
    def from_dict(cls, d) -> "Arch":
        """An Arch from untrusted data (a file header): every field known and sane. The first eight
        fields are required; the others default by family (files written before they existed)."""
        if not isinstance(d, dict):
            raise ValueError(f"arch must be an object, got {type(d).__name__}")
        names = [f.name for f in fields(cls)]
        required = names[:8]
        missing, extra = [n for n in required if n not in d], sorted(set(d) - set(names))
        if missing:
            raise ValueError(f"arch lacks fields {missing}")
        if extra:
            raise ValueError(f"arch has unknown fields {extra}")
        for key in ("n_layer", "d_model", "n_head", "d_mlp"):
            _check_size(key, d[key])
        for key in ("n_kv_head", "head_dim", "window"):
            if d.get(key) is not None:
                _check_size(key, d[key])
        for key, allowed in (("family", FAMILIES), ("norm", NORMS), ("activation", ACTIVATIONS), ("inputs", INPUTS),
                             ("positions", POSITIONS), ("pooling", POOLINGS), ("mlp", MLPS), ("residual", RESIDUALS)):
            if (key in required or d.get(key) is not None) and d[key] not in allowed:
                raise ValueError(f"arch {key} is {d[key]!r}: must be one of {allowed}")
        for key in ("causal", "qkv_bias", "o_bias", "mlp_bias", "head_bias", "embed_norm", "head_transform", "pooler",
                    "scale_attn", "scale_by_layer"):
            if d.get(key) is not None and not isinstance(d[key], bool):
                raise ValueError(f"arch {key} is {d[key]!r}: must be true or false")
        eps = d["eps"]
        if type(eps) not in (int, float) or not (math.isfinite(eps) and 0 < eps < 1):
            raise ValueError(f"arch eps is {eps!r}: must be a number in (0, 1)")
        for key in ("position_offset", "reserved_token"):
            v = d.get(key)
            if v is not None and (type(v) is not int or not 0 <= v <= MAX_SIZE):
                raise ValueError(f"arch {key} is {v!r}: must be an integer in [0, {MAX_SIZE}]")
        types = d.get("token_types", 0)
        if type(types) is not int or not 0 <= types <= MAX_SIZE:
            raise ValueError(f"arch token_types is {types!r}: must be an integer in [0, {MAX_SIZE}]")
        if d.get("conditioning") is not None and d["conditioning"] not in CONDITIONINGS:
            raise ValueError(f"arch conditioning is {d['conditioning']!r}: must be one of {CONDITIONINGS} or null")
        freq = d.get("freq_dim", 0)
        if type(freq) is not int or not 0 <= freq <= MAX_SIZE or freq % 2:
            raise ValueError(f"arch freq_dim is {freq!r}: must be an even integer in [0, {MAX_SIZE}]")
        _check_mamba_fields(d)
        _check_dit_fields(d, freq)
        rotary_dim = d.get("rotary_dim")
        if rotary_dim is not None and (type(rotary_dim) is not int or not 0 <= rotary_dim <= MAX_SIZE):
            raise ValueError(f"arch rotary_dim is {rotary_dim!r}: must be an integer in [0, {MAX_SIZE}]")
        theta = d.get("rope_theta", 10000.0)
        if type(theta) not in (int, float) or not (math.isfinite(theta) and theta > 1):
            raise ValueError(f"arch rope_theta is {theta!r}: must be a number > 1")
        arch = cls(**{n: d[n] for n in names if n in d})
        arch.check()
        return arch

    def check(self) -> None:
        """Consistency of the head layout (ValueError naming the sizes)."""
        if self.n_head % self.n_kv_head:
            raise ValueError(f"arch n_head {self.n_head} is not a multiple of n_kv_head {self.n_kv_head}")
        if self.head_dim == 0 or (self.head_dim * self.n_head != self.d_model and not self.rotary):
            # only rotary (LLaMA-family) models may have n_head * head_dim != d_model
            raise ValueError(f"arch d_model {self.d_model} is not divisible by n_head {self.n_head}"
                             if self.d_model % self.n_head else
                             f"arch d_model {self.d_model} does not fit n_head {self.n_head} x head_dim {self.head_dim}")
        if self.rotary and self.rotary_dim == self.head_dim and self.head_dim % 2:
            raise ValueError(f"arch head_dim {self.head_dim} must be even with rotary positions")
        if self.rotary and not (0 < self.rotary_dim <= self.head_dim and self.rotary_dim % 2 == 0):
            raise ValueError(f"arch rotary_dim {self.rotary_dim} must be even and in [2, head_dim {self.head_dim}]")
        if self.post_norm and (self.norm != "layernorm" or self.inputs != "tokens"):
            raise ValueError("arch residual 'post' is supported for LayerNorm token models only")
        if self.position_offset and self.positions != "learned":
            raise ValueError(f"arch position_offset {self.position_offset} needs learned positions")
        if self.pooler and self.pooling != "cls" and not self.head_transform:
            raise ValueError("arch pooler needs pooling 'cls' (a classifier) or a masked-LM head (next-sentence head)")
        if self.conditioned and (self.inputs != "patches" or self.residual != "sequential" or self.norm != "layernorm"
                                 or self.freq_dim < 2 or self.causal):
            raise ValueError("arch conditioning 'adaln' is supported for pre-norm LayerNorm patch models with a "
                             "timestep embedding (freq_dim >= 2), not causal")
        if not self.conditioned and (self.freq_shift or self.mlp_eps is not None or self.learn_sigma):
            raise ValueError("arch freq_shift, mlp_eps and learn_sigma need conditioning 'adaln' (DiT)")
        if self.mamba and (self.norm != "rmsnorm" or self.inputs != "tokens" or self.residual != "sequential"
                           or self.positions is not None or self.n_head != 1 or self.conditioned):
            raise ValueError("arch mixer 'mamba' is supported for sequential RMSNorm token models without positions "
                             "and with n_head 1")
        if self.mamba != (min(self.d_state, self.dt_rank, self.d_conv) > 0) or (
                not self.mamba and (self.conv_bias or self.proj_bias)):
            raise ValueError(f"arch d_state, dt_rank, d_conv ({self.d_state}, {self.dt_rank}, {self.d_conv}) must be "
                             "positive exactly with mixer 'mamba' (and conv_bias, proj_bias false without it)")
        if not self.rotary and self.rotary_dim:
            raise ValueError(f"arch rotary_dim {self.rotary_dim} needs rotary positions (positions is {self.positions!r})")


def _check_mamba_fields(d: dict) -> None:
    if d.get("mixer") is not None and d["mixer"] not in MIXERS:
        raise ValueError(f"arch mixer is {d['mixer']!r}: must be one of {MIXERS} or null")
    for key in ("d_state", "dt_rank", "d_conv"):
        v = d.get(key, 0)
        if type(v) is not int or not 0 <= v <= MAX_SIZE:
            raise ValueError(f"arch {key} is {v!r}: must be an integer in [0, {MAX_SIZE}]")
    for key in ("conv_bias", "proj_bias"):
        if d.get(key) is not None and not isinstance(d[key], bool):
            raise ValueError(f"arch {key} is {d[key]!r}: must be true or false")


def _check_dit_fields(d: dict, freq_dim: int) -> None:
    shift = d.get("freq_shift", 0)
    if type(shift) is not int or not 0 <= shift < max(freq_dim // 2, 1):
        raise ValueError(f"arch freq_shift is {shift!r}: must be an integer in [0, freq_dim / 2)")
    eps = d.get("mlp_eps")
    if eps is not None and (type(eps) not in (int, float) or not (math.isfinite(eps) and 0 < eps < 1)):
        raise ValueError(f"arch mlp_eps is {eps!r}: must be null or a number in (0, 1)")
    if d.get("learn_sigma") is not None and not isinstance(d["learn_sigma"], bool):
        raise ValueError(f"arch learn_sigma is {d['learn_sigma']!r}: must be true or false")


def _check_size(key: str, v) -> None:
    if type(v) is not int or not 1 <= v <= MAX_SIZE:
        raise ValueError(f"arch {key} is {v!r}: must be an integer in [1, {MAX_SIZE}]")


__all__ = ["ACTIVATIONS", "Arch", "CONDITIONINGS", "FAMILIES", "INPUTS", "MIXERS", "MLPS", "NORMS", "POOLINGS", "POSITIONS", "RESIDUALS"]
