"""Symmetry specs: which (parameter, axis) pairs each symmetry group acts on.

A group acts on an axis either by its matrix M ("primal": writers, W_Q, W_V, MLP rows) or by
M^{-T} ("dual": readers, W_K, W_O columns). For permutations and orthogonal maps the two
coincide. Architecture knowledge lives only here and in the adapters.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..models.adapters import Arch

KINDS = ("permutation", "orthogonal", "heads")
HEAD_MAPS = ("orthogonal", "invertible")
#: per-head maps of a heads group: HEAD_MAPS, or "none" (whole heads permuted, no per-head map:
#: the raw-space head permutation of the permutation baseline; elements are {"perm"} only)
NO_HEAD_MAP = "none"


@dataclass(frozen=True)
class Axis:
    param: str
    axis: int
    dual: bool = False
    circuit: str | None = None  # "qk" or "vo" inside a heads group
    query: bool = False  # heads group: blocks of the n_heads query heads (Q rows, O columns), not the
    # n_kv_heads key / value heads (K, V rows); the same without grouped-query attention


@dataclass(frozen=True)
class Group:
    name: str
    kind: str
    size: int
    axes: tuple[Axis, ...]
    centred: bool = False  # orthogonal map restricted to R 1 = 1 (LayerNorm models)
    n_heads: int = 0
    head_dim: int = 0
    head_map: str = "orthogonal"  # per-head QK / VO maps: O(d_h), GL(d_h), or "none" (identity)
    n_kv_heads: int = 0  # grouped-query attention: key / value heads (0: n_heads)
    # QK maps commute with RoPE on the first rotary_dim dims of each head: per frequency plane a rotation
    # (or a rotation and scale), any orthogonal (invertible) map of the rest; 0: no rotary positions
    rotary_dim: int = 0
    role: str = "layer"  # "layer": acts inside one block (heads, MLP units); "residual": the stream, every block

    @property
    def layer_local(self) -> bool:
        return self.role == "layer"

    @property
    def rotary(self) -> bool:
        return self.rotary_dim > 0

    @property
    def kv_heads(self) -> int:
        """Heads of the key / value axes: the units the head permutation moves."""
        return self.n_kv_heads or self.n_heads

    @property
    def group_size(self) -> int:
        """Query heads per key / value head (1: multi-head attention)."""
        return self.n_heads // self.kv_heads


@dataclass
class Spec:
    arch: Arch
    space: str  # "canonical": parameters in canonical form; "raw": as trained
    groups: dict[str, Group] = field(default_factory=dict)

    @property
    def residual(self) -> str | None:
        """The name of the residual stream's group (its role), or None if the spec has none."""
        return next((n for n, g in self.groups.items() if g.role == "residual"), None)

    def axes_of(self, param: str) -> list[tuple[Group, Axis]]:
        return [(g, a) for g in self.groups.values() for a in g.axes if a.param == param]

    def describe(self) -> dict:
        return {"space": self.space, "groups": {n: [g.kind, g.size] for n, g in self.groups.items()}}


# ----------------------------------------------------------------- residual stream roles
def residual_writers(arch: Arch) -> list[tuple[str, int]]:
    """(param, axis) of everything that adds into the residual stream."""
    if arch.conditioned:  # DiT: fixed positions, no class token
        out = [("patch_embed.weight", 0), ("patch_embed.bias", 0), ("pos_embed", 1)]
    elif arch.inputs == "patches":
        out = [("patch_embed.weight", 0), ("patch_embed.bias", 0), ("cls_token", 0), ("pos_embed", 1)]
    else:
        out = [("tok_embed.weight", 1)] + ([("pos_embed", 1)] if arch.positions == "learned" else [])
        out += [("type_embed", 1)] if arch.token_types else []
    for l in range(arch.n_layer):
        b = f"blocks.{l}."
        if arch.mamba:  # a Mamba block writes through its out projection alone
            out += [(b + "mamba.out.weight", 0)] + ([(b + "mamba.out.bias", 0)] if arch.proj_bias else [])
            continue
        out += [(b + "attn.o.weight", 0)] + ([(b + "attn.o.bias", 0)] if arch.o_bias else [])
        out += [(b + "mlp.fc2.weight", 0)] + ([(b + "mlp.fc2.bias", 0)] if arch.mlp_bias else [])
    return out


def norm_readers(arch: Arch) -> dict[str, list[str]]:
    """Each pre-norm's name -> the linear layers that read its output (what the canonical form folds it
    into). Post-norm models have none: their norms sit on the stream, read by the next block and by
    the residual connection alike; nor has DiT: its norms have no parameters (adaLN modulates them)."""
    if arch.post_norm or arch.conditioned:
        return {}
    out = {}
    for l in range(arch.n_layer):
        b = f"blocks.{l}."
        if arch.mamba:  # the block's one norm feeds the x and gate projections
            out[b + "ln1"] = [b + "mamba.in_x", b + "mamba.in_z"]
            continue
        out[b + "ln1"] = [b + "attn.q", b + "attn.k", b + "attn.v"]
        out[b + "ln2"] = arch.mlp_readers(l)
    out["ln_f"] = [arch.head_name]
    return out


def residual_readers(arch: Arch) -> list[tuple[str, int]]:
    if arch.conditioned:  # DiT: the modulated norms' readers and the output layer
        layers = [f"blocks.{l}.attn.{n}" for l in range(arch.n_layer) for n in "qkv"]
        layers += [r for l in range(arch.n_layer) for r in arch.mlp_readers(l)]
        return [(r + ".weight", 1) for r in layers + [arch.head_name]]
    if arch.post_norm:  # every block reads the stream directly, and so does the head's first layer
        heads = ["pooler"] if arch.pooler else []  # the classifier's or the next-sentence head's pooler
        if arch.pooling != "cls":
            heads.append("head_dense" if arch.head_transform else arch.head_name)
        layers = [f"blocks.{l}.attn.{n}" for l in range(arch.n_layer) for n in "qkv"]
        layers += [r for l in range(arch.n_layer) for r in arch.mlp_readers(l)]
        return [(r + ".weight", 1) for r in layers + heads]
    return [(r + ".weight", 1) for readers in norm_readers(arch).values() for r in readers]


def post_norm_stream(arch: Arch) -> list[tuple[str, int]]:
    """(param, axis) of the norms on a post-norm model's stream: their scales and shifts move with a
    permutation of it."""
    norms = (["ln_emb"] if arch.embed_norm else []) + [f"blocks.{l}.{n}" for l in range(arch.n_layer)
                                                        for n in ("ln1", "ln2")]
    return [(n + t, 0) for n in norms for t in (".weight", ".bias")]


def modulations(arch: Arch) -> list[str]:
    """DiT's per-channel modulations (blocks' shift / scale / gate, the output layer's shift / scale): linear
    maps of silu(c) whose rows are indexed by the stream's channels."""
    from ..models.functional_dit import MODULATIONS

    return [f"blocks.{l}.mod.{n}" for l in range(arch.n_layer) for n in MODULATIONS] + ["final.shift", "final.scale"]


def _conditioning_groups(arch: Arch) -> dict[str, Group]:
    """DiT's conditioning path: the permutation of c's channels (silu acts per channel: the timestep MLP's
    output rows, the class embedding's columns and every modulation's columns move together) and of the
    timestep MLP's hidden units."""
    mods = modulations(arch)
    cond = (Axis("t_embed.fc2.weight", 0), Axis("t_embed.fc2.bias", 0), Axis("y_embed.weight", 1),
            *(Axis(m + ".weight", 1, True) for m in mods))
    hidden = (Axis("t_embed.fc1.weight", 0), Axis("t_embed.fc1.bias", 0), Axis("t_embed.fc2.weight", 1, True))
    return {"cond": Group("cond", "permutation", arch.d_model, cond),
            "t_embed": Group("t_embed", "permutation", arch.d_model, hidden)}


# ---------------------------------------------------------------------- spec builders
def _mamba_groups(arch: Arch) -> dict[str, Group]:
    """Per Mamba block: its inner channels ("inner.L": everything indexed by the channel moves together) and
    its states ("state.L": B's and C's rows, A's columns); exact on raw and canonical parameters alike
    (docs/ARCHITECTURE.md, section 1)."""
    groups = {}
    for l in range(arch.n_layer):
        b = f"blocks.{l}.mamba."
        rows = ["in_x.weight", "in_z.weight", "conv.weight", "dt.weight", "dt.bias", "A_log", "D"]
        rows += (["in_x.bias", "in_z.bias"] if arch.proj_bias else []) + (["conv.bias"] if arch.conv_bias else [])
        axes = [Axis(b + n, 0) for n in rows] + [Axis(b + n + ".weight", 1, True) for n in ("x_dt", "x_B", "x_C", "out")]
        groups[f"inner.{l}"] = Group(f"inner.{l}", "permutation", arch.d_inner, tuple(axes))
        axes = (Axis(b + "x_B.weight", 0), Axis(b + "x_C.weight", 0), Axis(b + "A_log", 1))
        groups[f"state.{l}"] = Group(f"state.{l}", "permutation", arch.d_state, axes)
    return groups


def _layer_groups(arch: Arch, head_map: str | None) -> dict[str, Group]:
    if arch.mamba:
        return _mamba_groups(arch)
    groups = {}
    for l in range(arch.n_layer):
        b = f"blocks.{l}."
        if head_map is not None:
            # Q rows and O columns: n_head blocks (query heads); K / V rows: n_kv_head blocks
            axes = [Axis(b + "attn.q.weight", 0, False, "qk", query=True), Axis(b + "attn.k.weight", 0, True, "qk"),
                    Axis(b + "attn.v.weight", 0, False, "vo"), Axis(b + "attn.o.weight", 1, True, "vo", query=True)]
            if arch.qkv_bias:
                axes += [Axis(b + "attn.q.bias", 0, False, "qk", query=True), Axis(b + "attn.k.bias", 0, True, "qk"),
                         Axis(b + "attn.v.bias", 0, False, "vo")]
            groups[f"heads.{l}"] = Group(f"heads.{l}", "heads", arch.n_head * arch.head_dim, tuple(axes),
                                         n_heads=arch.n_head, head_dim=arch.head_dim, head_map=head_map,
                                         n_kv_heads=arch.n_kv_head,
                                         rotary_dim=arch.rotary_dim if head_map != NO_HEAD_MAP else 0)
        readers = [r + ".weight" for r in arch.mlp_readers(l)]
        axes = [Axis(r, 0) for r in readers]
        if arch.mlp_bias:
            axes += [Axis(r.replace(".weight", ".bias"), 0) for r in readers]
        axes.append(Axis(b + "mlp.fc2.weight", 1, True))
        groups[f"mlp.{l}"] = Group(f"mlp.{l}", "permutation", arch.d_mlp, tuple(axes))
    if arch.pooler:  # the pooler's tanh units (BERT's sequence classifiers and next-sentence head)
        groups["pooler"] = Group("pooler", "permutation", arch.d_model,
                                 (Axis("pooler.weight", 0), Axis("pooler.bias", 0), Axis(arch.pooler_head + ".weight", 1, True)))
    if arch.head_transform:  # BERT's masked-LM transform: its units, with its norm, read by the head
        axes = (Axis("head_dense.weight", 0), Axis("head_dense.bias", 0), Axis("ln_head.weight", 0),
                Axis("ln_head.bias", 0), Axis(arch.head_name + ".weight", 1, True))
        groups["head_transform"] = Group("head_transform", "permutation", arch.d_model, axes)
    if arch.conditioned:
        groups.update(_conditioning_groups(arch))
    return groups


def _permutation_residual(arch: Arch) -> Group:
    """A post-norm stream's symmetry, and DiT's: a permutation (a rotation does not commute with the norms'
    scales, nor with DiT's per-channel modulations, whose rows move with it)."""
    on_stream = post_norm_stream(arch) if arch.post_norm else []
    if arch.conditioned:
        on_stream = [(m + t, 0) for m in modulations(arch) for t in (".weight", ".bias")]
    axes = [Axis(p, a) for p, a in residual_writers(arch) + on_stream]
    axes += [Axis(p, a, True) for p, a in residual_readers(arch)]
    return Group("residual", "permutation", arch.d_model, tuple(axes), role="residual")


def canonical_spec(arch: Arch, head_map: str = "orthogonal") -> Spec:
    """Every symmetry of docs/ARCHITECTURE.md, section 1, on canonical parameters: residual orthogonal map
    (R 1 = 1 for LayerNorm), per-layer head permutation with per-head QK / VO maps, per-layer
    MLP permutation. Norm biases left by the canonical form (c = beta / gamma) rotate with R.
    Grouped-query attention: key / value heads permute with their query heads, query heads permute
    within their group, one QK and one VO map per key / value head; rotary models: QK maps that
    commute with RoPE (per frequency plane a 2x2 rotation, or a rotation and scale)."""
    if head_map not in HEAD_MAPS:
        raise ValueError(f"head_map must be one of {HEAD_MAPS}, got {head_map!r}")
    if arch.post_norm or arch.conditioned:
        return Spec(arch, "canonical", {**_layer_groups(arch, head_map), "residual": _permutation_residual(arch)})
    axes = [Axis(p, a) for p, a in residual_writers(arch)]
    axes += [Axis(p, a, True) for p, a in residual_readers(arch)]
    if arch.norm == "layernorm":
        axes += [Axis(n + ".bias", 0) for n in norm_readers(arch)]
    residual = Group("residual", "orthogonal", arch.d_model, tuple(axes), centred=arch.norm == "layernorm",
                     role="residual")
    return Spec(arch, "canonical", {**_layer_groups(arch, head_map), "residual": residual})


def permutation_spec(arch: Arch, heads: bool = True) -> Spec:
    """The Git Re-Basin baseline on raw parameters: the residual stream as one permutation
    (norm scales and shifts move with it), one permutation per MLP, and one permutation of
    whole heads per layer (Q / K / V row blocks with their biases and O column blocks move
    together, no per-head map: Verma & Elbayad's Transformer re-basin). `heads=False`
    leaves attention alone (the earlier baseline)."""
    if arch.post_norm or arch.conditioned:
        return Spec(arch, "raw", {**_layer_groups(arch, NO_HEAD_MAP if heads else None),
                                  "residual": _permutation_residual(arch)})
    axes = [Axis(p, a) for p, a in residual_writers(arch)]
    axes += [Axis(p, a, True) for p, a in residual_readers(arch)]
    for n in norm_readers(arch):
        axes.append(Axis(n + ".weight", 0))
        if arch.norm == "layernorm":
            axes.append(Axis(n + ".bias", 0))
    residual = Group("residual", "permutation", arch.d_model, tuple(axes), role="residual")
    return Spec(arch, "raw", {**_layer_groups(arch, NO_HEAD_MAP if heads else None), "residual": residual})
