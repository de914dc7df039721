"""diffusers.DiTTransformer2DModel (DiT as diffusers writes it; the original DiT checkpoints converted to it).

What differs from the reference DiT (lmc_fast/models/dit.py), and where this adapter takes it:
- every block's AdaLayerNormZero owns a conditioning embedding (norm1.emb: the timestep MLP and the class table)
  and the output layer reads block 0's. The library has one conditioning path, so a model maps only when every
  block's embedding equals block 0's (as converted checkpoints have: the conversion copies DiT's one embedding into
  every block); `build` writes the one path into every block. Blocks that differ are refused.
- the timestep features divide the exponents by half - downscale_freq_shift (1): Arch.freq_shift.
- the MLP branch's norm (norm3) takes norm_eps (default 1e-5); the attention branch's and the output's are fixed
  at 1e-6: Arch.eps and Arch.mlp_eps.
- proj_out_2's rows are per patch in (p, q, c) order (unpatchify's "nhwpqc"), ours in patchify's (c, p, q): the
  rows are permuted here, not in the forward. With out_channels = 2 * in_channels (learn_sigma, DiT-XL/2) the
  last in_channels channels are the variance, kept as `out`'s last rows (they read the stream, so alignments move
  them) but not scored (Arch.learn_sigma: the forward returns the noise rows).
- the six modulations are one Linear(d, 6 d) (norm1.linear, chunks in MODULATIONS' order), proj_out_1 the final
  (shift, scale): cut into standard parameters here, joined again in `build`.
- the fixed positions are a non-persistent buffer (pos_embed.pos_embed, (1, N, d)): read and written as a
  standard parameter, so an alignment permutes them with the stream.
In memory only: io.py loads Hugging Face folders through transformers' config classes, and a diffusers folder
(config.json with "_class_name") is refused there in one line.
"""
from __future__ import annotations

import copy

import torch

from ..arch import Arch
from ..functional_dit import MODULATIONS, unpack_inputs
from ..vit import patchify
from .base import Adapter, Export, Source, UnsupportedModelError, _load, from_layout

CLASS = "DiTTransformer2DModel"
ACTIVATIONS = {"gelu": "gelu", "gelu-approximate": "gelu_tanh"}
POS = "pos_embed.pos_embed"  # a buffer, not in the state dict
# the conditioning embedding, ours <- theirs under transformer_blocks.L.norm1.emb.
CONDITIONING = (("t_embed.fc1", "timestep_embedder.linear_1"), ("t_embed.fc2", "timestep_embedder.linear_2"))
# per block, stored as they are: ours under blocks.L. <- theirs under transformer_blocks.L.
LAYER_NAMES = (("attn.q", "attn1.to_q"), ("attn.k", "attn1.to_k"), ("attn.v", "attn1.to_v"),
               ("attn.o", "attn1.to_out.0"), ("mlp.fc1", "ff.net.0.proj"), ("mlp.fc2", "ff.net.2"))


def _cat(*xs):
    return torch.cat(xs)


def _stored(ours: str, t: str, attention_bias: bool) -> bool:
    """Whether the class has this tensor: q / k / v biases only with attention_bias (to_out's always)."""
    return t == "weight" or attention_bias or ours not in ("attn.q", "attn.k", "attn.v")


class DiffusersDiTAdapter(Adapter):
    """diffusers.DiTTransformer2DModel with norm_type "ada_norm_zero" and one conditioning path."""

    not_streamed = ("DiT's conditioning vector is read by every block's modulations, so no block of it can be "
                    "brought to canonical form alone")
    # the config fields that shape the function (dropout, upcast_attention and norm_num_groups do not)
    FIELDS = ("num_attention_heads", "attention_head_dim", "in_channels", "out_channels", "num_layers",
              "attention_bias", "sample_size", "patch_size", "activation_fn", "num_embeds_ada_norm", "norm_type",
              "norm_elementwise_affine", "norm_eps")

    # ---------------------------------------------------------------- what maps
    def _emb(self, model):
        return model.transformer_blocks[0].norm1.emb

    def arch(self, model):
        c = model.config
        act = ACTIVATIONS.get(c.activation_fn)
        if act is None:
            raise UnsupportedModelError(f"{CLASS} activation_fn={c.activation_fn!r} is not supported "
                                        f"(supported: {', '.join(ACTIVATIONS)})")
        if c.norm_type != "ada_norm_zero" or len(model.transformer_blocks) < 1:
            raise UnsupportedModelError(f"{CLASS} norm_type={c.norm_type!r} with num_layers={c.num_layers} is not "
                                        "supported (only adaLN-Zero, at least one block)")
        if c.norm_elementwise_affine:
            raise UnsupportedModelError(f"{CLASS} norm_elementwise_affine=True is not supported (the MLP branch's "
                                        "norm would carry a scale and shift, which the library's DiT does not have)")
        C, out = c.in_channels, model.out_channels
        if out not in (C, 2 * C):
            raise UnsupportedModelError(f"{CLASS} out_channels={out} with in_channels={C} is not supported: the output "
                                        "must be the noise (in_channels) or the noise and its variance "
                                        "(2 x in_channels)")
        emb = self._emb(model)
        proj, table = emb.time_proj, emb.class_embedder
        if not proj.flip_sin_to_cos or proj.scale != 1 or proj.downscale_freq_shift != int(proj.downscale_freq_shift):
            raise UnsupportedModelError(f"{CLASS} timestep features with flip_sin_to_cos={proj.flip_sin_to_cos}, "
                                        f"scale={proj.scale}, downscale_freq_shift={proj.downscale_freq_shift} are not "
                                        "supported (cos first, scale 1, a whole shift)")
        if table.embedding_table.num_embeddings != table.num_classes + 1:
            # the library's class table ends in the null class that classifier-free guidance (and its checks) use
            raise UnsupportedModelError(f"{CLASS} with class_dropout_prob 0 has no null-class row: not supported")
        eps, final_eps = model.transformer_blocks[0].norm1.norm.eps, model.norm_out.eps
        if eps != final_eps:
            raise UnsupportedModelError(f"{CLASS} norms of eps {eps} (attention) and {final_eps} (output): only one "
                                        "epsilon beside the MLP's can be mapped")
        mlp_eps = float(c.norm_eps)
        d = model.inner_dim
        return Arch.dit(c.num_layers, d, c.num_attention_heads, model.transformer_blocks[0].ff.net[2].in_features,
                        proj.num_channels, eps=float(eps), activation=act, qkv_bias=bool(c.attention_bias),
                        freq_shift=int(proj.downscale_freq_shift), mlp_eps=None if mlp_eps == eps else mlp_eps,
                        learn_sigma=out == 2 * C)

    def config_fields(self, model):
        a = self.arch(model)  # refuses what cannot be mapped
        out = {k: getattr(model.config, k, None) for k in self.FIELDS}
        out.update(out_channels=model.out_channels, d_mlp=a.d_mlp)  # None in the config means in_channels
        return out

    def shape_fields(self, model):
        c = model.config
        return {"image_size": c.sample_size, "patch_size": c.patch_size, "channels": c.in_channels,
                "num_classes": c.num_embeds_ada_norm}

    def resized(self, template, d_mlp: int):
        raise UnsupportedModelError(f"{CLASS} models of different MLP widths cannot be aligned (its MLP is 4 x the "
                                    "width, not a config field, so a narrower one cannot be padded)")

    # ---------------------------------------------------------------- standard parameters in and out
    def layout(self, model):
        return None  # loaded whole (not_streamed), as the reference DiT

    def _sources(self, model) -> dict[str, Source]:
        """Standard name -> where it is in `_state(model)` (the layout the streamed reader would take)."""
        c, d = model.config, model.inner_dim
        P, out = c.patch_size, model.out_channels
        # proj_out_2's rows per patch (p, q, c) -> patchify's (c, p, q); a bias is a column of one
        to_ours = lambda t: t.reshape(P, P, out, -1).permute(2, 0, 1, 3).reshape(t.shape)  # noqa: E731
        e = "transformer_blocks.0.norm1.emb."
        p = {"patch_embed.weight": Source("pos_embed.proj.weight", lambda t: t.reshape(d, -1)),  # Conv2d's (C, p, p)
             "patch_embed.bias": Source("pos_embed.proj.bias"),
             "pos_embed": Source(POS, lambda t: t.reshape(-1, d)),
             "y_embed.weight": Source(e + "class_embedder.embedding_table.weight")}
        for ours, theirs in CONDITIONING:
            for t in ("weight", "bias"):
                p[f"{ours}.{t}"] = Source(f"{e}{theirs}.{t}")
        for l in range(c.num_layers):
            h, b = f"transformer_blocks.{l}.", f"blocks.{l}."
            for t in ("weight", "bias"):
                # norm1.linear's chunks: shift, scale, gate of attention, then of the MLP (MODULATIONS' order)
                for i, n in enumerate(MODULATIONS):
                    p[b + f"mod.{n}.{t}"] = Source(h + f"norm1.linear.{t}", lambda x, i=i: x[i * d:(i + 1) * d])
                for ours, theirs in LAYER_NAMES:
                    if _stored(ours, t, c.attention_bias):
                        p[b + f"{ours}.{t}"] = Source(h + f"{theirs}.{t}")
        for t in ("weight", "bias"):
            p[f"final.shift.{t}"] = Source(f"proj_out_1.{t}", lambda x: x[:d])
            p[f"final.scale.{t}"] = Source(f"proj_out_1.{t}", lambda x: x[d:])
            p[f"out.{t}"] = Source(f"proj_out_2.{t}", to_ours)
        return p

    def _exports(self, model) -> dict[str, Export]:
        """Each tensor of `_state(model)` made from standard parameters: the one conditioning path into every block."""
        c, d = model.config, model.inner_dim
        P, out = c.patch_size, model.out_channels
        to_theirs = lambda t: t.reshape(out, P, P, -1).permute(1, 2, 0, 3).reshape(t.shape)  # noqa: E731
        conv = model.pos_embed.proj.weight.shape
        ex = {"pos_embed.proj.weight": Export(("patch_embed.weight",), lambda t: t.reshape(conv)),
              "pos_embed.proj.bias": Export(("patch_embed.bias",)),
              POS: Export(("pos_embed",), lambda t: t.reshape(1, -1, d))}
        for l in range(c.num_layers):
            h, b = f"transformer_blocks.{l}.", f"blocks.{l}."
            ex[h + "norm1.emb.class_embedder.embedding_table.weight"] = Export(("y_embed.weight",))
            for t in ("weight", "bias"):
                for ours, theirs in CONDITIONING:
                    ex[f"{h}norm1.emb.{theirs}.{t}"] = Export((f"{ours}.{t}",))
                ex[h + f"norm1.linear.{t}"] = Export(tuple(b + f"mod.{n}.{t}" for n in MODULATIONS), _cat)
                for ours, theirs in LAYER_NAMES:
                    if _stored(ours, t, c.attention_bias):
                        ex[h + f"{theirs}.{t}"] = Export((b + f"{ours}.{t}",))
        for t in ("weight", "bias"):
            ex[f"proj_out_1.{t}"] = Export((f"final.shift.{t}", f"final.scale.{t}"), _cat)
            ex[f"proj_out_2.{t}"] = Export((f"out.{t}",), to_theirs)
        return ex

    @staticmethod
    def _state(model) -> dict:
        return {**model.state_dict(), POS: model.pos_embed.pos_embed}

    def get(self, model):
        self.arch(model)
        self._check_one_conditioning(model)
        return from_layout(self._sources(model), self._state(model))

    def _check_one_conditioning(self, model) -> None:
        ref = self._emb(model).state_dict()
        for l, block in enumerate(model.transformer_blocks[1:], start=1):
            for k, v in block.norm1.emb.state_dict().items():
                if not torch.equal(v, ref[k]):
                    raise UnsupportedModelError(
                        f"{CLASS} block {l}'s conditioning embedding (norm1.emb.{k}) differs from block 0's: only "
                        "models with one conditioning path (every block's embedding equal, as in converted DiT "
                        "checkpoints) can be mapped")

    def build(self, template, params):
        self.arch(template)
        model = copy.deepcopy(template)
        state = {key: (params[e.names[0]] if e.make is None else e.make(*(params[n] for n in e.names)))
                 for key, e in self._exports(model).items()}
        pos, buffer = state.pop(POS), model.pos_embed.pos_embed
        if pos.shape != buffer.shape:  # _load checks the state dict's shapes; the buffer is not in it
            raise ValueError(f"parameter 'pos_embed': shape {tuple(pos.shape[1:])} does not fit {tuple(buffer.shape[1:])}")
        _load(model, state)
        with torch.no_grad():
            buffer.copy_(pos.to(buffer.dtype))
        return model

    def logits(self, model, inputs):
        """Packed inputs (B, C + 2, H, W) -> the predicted noise per patch (B, N, C p p) in patchify's layout."""
        x_t, t, y = unpack_inputs(inputs)
        sample = model(x_t, timestep=t, class_labels=y).sample
        return patchify(sample[:, : model.config.in_channels], model.config.patch_size)
