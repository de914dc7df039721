"""The canonical form (docs/ARCHITECTURE.md, section 1), computed in float64 on standard parameters.

- each norm's scale is folded into its readers (W <- W diag(gamma)) and its shift into the
  readers' biases (b <- b + W beta); a reader without a bias (GPT-2's LM head) keeps the
  shift as a norm bias c = beta / gamma added after normalising;
- LayerNorm models: every writer is centred (W <- C W), so LN(h) equals RMSNorm(h);
- b_K <- 0 (softmax ignores a per-query constant; not with rotary positions, where q . R b_K
  depends on the key's position); b_O <- b_O + W_O b_V, b_V <- 0 (attention weights sum to
  one; only where the output projection has a bias to take it, and not with grouped-query
  attention's shared values: W_O b_V then needs every query head's block, which it has);
- gated MLPs (SwiGLU): fc2(act(gate x) * fc1 x) is unchanged when unit i's fc1 row (and bias) is
  scaled by s > 0 and its fc2 column by 1 / s, so each unit is balanced: s makes both norms
  sqrt(||fc1_i|| ||fc2_:,i||). Permutations and residual rotations keep both norms, so the balanced
  form of g . A is the balanced form of A moved by the rest of g: the scales need no matching.
- DiT (adaLN-Zero): each branch's modulated input LN(x) (1 + scale) + shift may be scaled per channel by
  a != 0 against its readers' columns (scale' = a (1 + scale) - 1, shift' = a shift: both linear in silu(c),
  so the modulation's rows and biases take it), and each gate row against its branch's output rows
  (gate' = a gate, W_O' = W_O / a); both are balanced (the two sides' norms made equal) and signed
  (1 + scale's bias > 0, the gate's bias >= 0): only permutations of the stream act on these rows, and
  they keep norms and signs, so no matcher searches the scales.
- Mamba: each inner channel's scale (in_x row against conv row), each state's (B row against C row) and
  dt's GL(dt_rank) factorisation are fixed (symmetry/mamba.py says how and why that commutes with the rest).
The result is idempotent and exports back to the original class.
"""
from __future__ import annotations

import torch

from ..models.adapters import Arch, adapter_for, standard_params
from .mamba import canonical_mixer
from .spec import norm_readers, residual_writers

# |gamma| below this fraction of max |gamma| makes beta / gamma unstable.
GAMMA_TOLERANCE = 1e-6


def canonical_params(arch: Arch, params: dict[str, torch.Tensor], dtype=torch.float64,
                     partial: bool = False) -> dict[str, torch.Tensor]:
    """The canonical parameters in `dtype` (float64 by default). Each tensor is transformed in
    float64 and stored in `dtype` as soon as it is done, so float32 results cost one float32 copy
    of the model plus one tensor's float64 scratch (what a 1B model on a laptop needs).

    `partial`: `params` is one block of the model that the canonical form does not couple to the rest
    (`coupled_blocks`; a streamed checkpoint's unit of reading): steps on absent parameters are skipped."""
    p = {k: v.detach() for k, v in params.items()}
    if partial:
        _check_closed(arch, p)
    d64 = lambda name: p[name].to(torch.float64)  # noqa: E731 - a float64 working copy of one tensor
    done = set()

    def store(name: str, value: torch.Tensor) -> None:
        p[name] = value.to(dtype)
        done.add(name)

    for norm, readers in norm_readers(arch).items():
        if partial and norm + ".weight" not in p:
            continue
        gamma = d64(norm + ".weight")
        beta = d64(norm + ".bias") if norm + ".bias" in p else None
        # a reader without a bias (GPT-2's LM head) cannot absorb beta: keep it as c = beta / gamma
        keep_shift = beta is not None and any(r + ".bias" not in p for r in readers)
        for r in readers:
            W = d64(r + ".weight")
            if beta is not None and not keep_shift:
                store(r + ".bias", d64(r + ".bias") + W @ beta)
            store(r + ".weight", W * gamma)
        if keep_shift:
            small = gamma.abs() <= GAMMA_TOLERANCE * gamma.abs().max()
            if (small & (beta != 0)).any():
                raise ValueError(
                    f"norm {norm!r}: weight (gamma) is near zero at {int(small.sum())} positions where its bias is "
                    "not, so the canonical norm bias beta / gamma is unstable"
                )
            store(norm + ".bias", torch.where(small, torch.zeros_like(beta), beta / gamma))
        elif beta is not None:
            store(norm + ".bias", torch.zeros_like(beta))
        store(norm + ".weight", torch.ones_like(gamma))
    for l in range(arch.n_layer):
        b = f"blocks.{l}.attn."
        if b + "v.bias" in p and b + "o.bias" in p:
            # each query head h reads value head h // group_size: expand b_V to the query heads
            b_v = d64(b + "v.bias").reshape(arch.n_kv_head, 1, arch.head_dim).expand(-1, arch.group_size, -1)
            store(b + "o.bias", d64(b + "o.bias") + d64(b + "o.weight") @ b_v.reshape(-1))
            store(b + "v.bias", torch.zeros_like(b_v[:, 0].reshape(-1)))
        if b + "k.bias" in p and not arch.rotary:
            store(b + "k.bias", torch.zeros_like(d64(b + "k.bias")))
    if arch.norm == "layernorm" and not arch.post_norm and not arch.conditioned:  # DiT's gates break centring
        for name, axis in residual_writers(arch):
            if partial and name not in p:
                continue
            W = d64(name)
            store(name, W - W.mean(dim=axis, keepdim=True))
    if arch.gated:  # after centring: the balance reads the final fc2 columns
        for l in range(arch.n_layer):
            if partial and f"blocks.{l}.mlp.fc1.weight" not in p:
                continue
            for name, make in balanced_units(p, f"blocks.{l}.mlp.").items():
                store(name, make())
    if arch.mamba:  # after the norms fold into in_x: channel and state scales, dt's factorisation (mamba.py)
        for l in range(arch.n_layer):
            if partial and f"blocks.{l}.mamba.in_x.weight" not in p:
                continue
            for name, value in canonical_mixer(p, f"blocks.{l}.mamba.").items():
                store(name, value)
    if arch.conditioned:  # after b_V moved into b_O: the gates' balance reads the final output biases
        if partial:
            raise ValueError("DiT checkpoints are not streamed: load them whole")
        for name, value in balanced_modulations(arch, p).items():
            store(name, value)
    # the rest unchanged, as copies (the result never shares memory with `params`)
    return {k: (v if k in done else v.to(dtype, copy=True)) for k, v in p.items()}


def coupled_blocks(arch: Arch, names) -> list[list[str]]:
    """`names` (standard parameters) split into the blocks the canonical form transforms independently:
    one per layer and one of the rest, joined where a norm folds into readers in another block (post-norm
    models: none). Lists keep the order of `names`."""
    names = list(names)
    block = {n: (n.split(".")[1] if n.startswith("blocks.") else "outer") for n in names}
    parent = {b: b for b in block.values()}

    def root(b):
        while parent[b] != b:
            b = parent[b]
        return b

    for norm, readers in norm_readers(arch).items():
        here = [block[n] for n in names if n.rsplit(".", 1)[0] in (norm, *readers)]
        for other in here[1:]:
            parent[root(other)] = root(here[0])
    out = {}
    for n in names:
        out.setdefault(root(block[n]), []).append(n)
    return list(out.values())


def _check_closed(arch: Arch, p: dict) -> None:
    """A block given to the partial canonical form holds each norm together with all its readers."""
    for norm, readers in norm_readers(arch).items():
        have = [r + ".weight" in p for r in readers]
        if (norm + ".weight" in p) != all(have) or (any(have) and not all(have)):
            raise ValueError(f"internal: block splits norm {norm!r} from its readers")


def balanced_units(p: dict, prefix: str) -> dict:
    """fc1 (rows and bias) and fc2 (columns) of one gated MLP with each unit's scale balanced, in float64:
    {name: a function making it}, so that the caller stores each (in its dtype) before the next is made:
    at a 7B model's width one float64 copy is 0.47 GB. A unit with a zero side (a zero-padded unit) keeps s = 1."""
    d64 = lambda name: p[name].to(torch.float64)  # noqa: E731 - one tensor's float64 working copy
    has_bias = prefix + "fc1.bias" in p
    up_sq = d64(prefix + "fc1.weight").pow(2).sum(1) + (d64(prefix + "fc1.bias").pow(2) if has_bias else 0.0)
    down_norm = d64(prefix + "fc2.weight").norm(dim=0)
    up_norm = up_sq.sqrt()
    live = (up_norm > 0) & (down_norm > 0)
    s = torch.where(live, (down_norm / torch.where(live, up_norm, 1.0)).sqrt(), torch.ones_like(up_norm))
    out = {prefix + "fc1.weight": lambda: d64(prefix + "fc1.weight") * s[:, None],
           prefix + "fc2.weight": lambda: d64(prefix + "fc2.weight") / s[None, :]}
    if has_bias:
        out[prefix + "fc1.bias"] = lambda: d64(prefix + "fc1.bias") * s
    return out


def _signed(primary: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    """Per row the sign of `primary`, where it is zero that of `fallback`, else +1: a sign every permutation
    of the rows keeps."""
    s = torch.sign(primary)
    s = torch.where(s == 0, torch.sign(fallback), s)
    return torch.where(s == 0, torch.ones_like(s), s)


def _balance(side_sq: torch.Tensor, other_sq: torch.Tensor, sign: torch.Tensor) -> torch.Tensor:
    """The per-channel factor a that makes both sides' norms sqrt(|side| |other|), with the given sign
    (1 where either side is zero)."""
    side, other = side_sq.sqrt(), other_sq.sqrt()
    live = (side > 0) & (other > 0)
    return torch.where(live, (other / torch.where(live, side, 1.0)).sqrt() * sign, torch.ones_like(side))


def balanced_modulations(arch: Arch, p: dict) -> dict:
    """DiT's modulations, their readers and the gated outputs with each channel's free scale and sign fixed,
    in float64 (the module docstring says which maps these are and why they are exact)."""
    d64 = lambda name: p[name].to(torch.float64)  # noqa: E731
    out = {}
    branches = []  # (shift, scale, readers) of every modulated norm
    for l in range(arch.n_layer):
        b = f"blocks.{l}."
        branches += [(b + "mod.shift1", b + "mod.scale1", [b + f"attn.{n}" for n in "qkv"]),
                     (b + "mod.shift2", b + "mod.scale2", arch.mlp_readers(l))]
    branches.append(("final.shift", "final.scale", [arch.head_name]))
    for shift, scale, readers in branches:
        Ws, bs, Wt, bt = d64(scale + ".weight"), d64(scale + ".bias"), d64(shift + ".weight"), d64(shift + ".bias")
        gain = 1 + bs
        side = Ws.pow(2).sum(1) + gain.pow(2) + Wt.pow(2).sum(1) + bt.pow(2)
        R = [d64(r + ".weight") for r in readers]
        a = _balance(side, sum(W.pow(2).sum(0) for W in R), _signed(gain, Ws.sum(1)))
        out.update({scale + ".weight": Ws * a[:, None], scale + ".bias": a * gain - 1,
                    shift + ".weight": Wt * a[:, None], shift + ".bias": bt * a})
        out.update({r + ".weight": W / a[None, :] for r, W in zip(readers, R)})
    for l in range(arch.n_layer):
        b = f"blocks.{l}."
        for gate, writer in ((b + "mod.gate1", b + "attn.o"), (b + "mod.gate2", b + "mlp.fc2")):
            Wg, bg, Wo, bo = d64(gate + ".weight"), d64(gate + ".bias"), d64(writer + ".weight"), d64(writer + ".bias")
            a = _balance(Wg.pow(2).sum(1) + bg.pow(2), Wo.pow(2).sum(1) + bo.pow(2), _signed(bg, Wg.sum(1)))
            out.update({gate + ".weight": Wg * a[:, None], gate + ".bias": bg * a,
                        writer + ".weight": Wo / a[:, None], writer + ".bias": bo / a})
    return out


def to_canonical(model):
    """A model of the same class computing the same function, in canonical form."""
    arch, params = standard_params(model)
    return adapter_for(model).build(model, canonical_params(arch, params))
