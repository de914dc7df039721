"""What weight matching maximises: sum_p <A'_p, g.B_p>, with A's parameters weighted (per tensor, and
by token frequency along the rows of the token-indexed tensors). Every weighting keeps the objective
linear in g.B, so every solver works on it unchanged."""
from __future__ import annotations

import torch

from ..numerics import all_finite
from .options import WEIGHTINGS  # the one list: lf.align and the grid check the option by it

# parameters whose rows are indexed by token id (standard params): the token-frequency prior
# weighs these rows. The head's rows count too: its targets follow the same token distribution.
TOKEN_ROW_PARAMS = ("tok_embed.weight", "lm_head.weight")


def _as_counts(token_counts, vocab: int) -> torch.Tensor:
    """A counts vector as given, or the bincount of the input ids of (inputs, targets) batches."""
    if isinstance(token_counts, torch.Tensor):
        return token_counts
    if hasattr(token_counts, "__array__"):  # numpy and the like
        return torch.as_tensor(token_counts)
    try:
        batches = iter(token_counts)
    except TypeError:
        raise ValueError(f"token_counts must be a 1-D counts vector or (inputs, targets) batches, "
                         f"got {type(token_counts).__name__}") from None
    counts, seen = torch.zeros(vocab, dtype=torch.int64), False
    for batch in batches:
        if not (isinstance(batch, (tuple, list)) and len(batch) == 2 and isinstance(batch[0], torch.Tensor)
                and not batch[0].is_floating_point() and not batch[0].is_complex()):
            raise ValueError("token_counts batches must be (inputs, targets) with integer token-id inputs")
        ids = batch[0].reshape(-1).long().cpu()
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
            raise ValueError(f"token_counts batches hold token ids outside [0, {vocab})")
        counts += torch.bincount(ids, minlength=vocab)
        seen = True
    if not seen:
        raise ValueError("token_counts batches are empty")
    return counts


def token_weights(token_counts, vocab: int | dict) -> torch.Tensor:
    """Per-token weights counts / mean(counts) (float64, mean 1) for the token-frequency prior.
    `vocab`: the vocabulary size, or a language model's parameters (their tok_embed.weight gives it).

    Uniform counts give exactly 1 everywhere, i.e. the unweighted objective."""
    if isinstance(vocab, dict):
        if "tok_embed.weight" not in vocab:
            raise ValueError("token_counts needs a language model (no tok_embed.weight among its parameters)")
        vocab = vocab["tok_embed.weight"].shape[0]
    counts = _as_counts(token_counts, vocab)
    if counts.dim() != 1 or len(counts) != vocab:
        raise ValueError(f"token_counts must be a 1-D vector of length vocab_size={vocab}, got shape "
                         f"{tuple(counts.shape)}")
    if counts.is_complex() or counts.dtype == torch.bool:
        raise ValueError(f"token_counts must be real numbers, got {counts.dtype}")
    counts = counts.to(torch.float64)
    if not all_finite(counts) or bool((counts < 0).any()) or not bool((counts > 0).any()):
        raise ValueError("token_counts must be finite, non-negative and not all zero")
    if bool((counts == counts[0]).all()):
        return torch.ones_like(counts)  # exactly the unweighted objective, free of rounding
    return counts * (vocab / counts.sum())


def _with_token_prior(pa: dict, weights: torch.Tensor, rows: dict) -> dict:
    """A's token-indexed rows scaled by the token weights: <w * A_p, g.B_p> = sum_t w_t <A_t, (g.B)_t>,
    still linear in g.B. `rows`: the (start, stop) of parameters given as a block of their rows."""
    out = dict(pa)
    for n in TOKEN_ROW_PARAMS:
        if n not in pa:
            continue
        # a whole tensor takes the prior when it has a row per token; a block, by where its rows lie
        start, stop = rows[n] if n in rows else (0, pa[n].shape[0])
        if (stop <= len(weights)) if n in rows else (stop == len(weights)):
            out[n] = pa[n] * weights[start:stop].to(pa[n].dtype)[:, None]
    return out


def tensor_norms(params: dict) -> dict:
    """||p|| of each parameter, in float64 (what per-tensor weighting divides by)."""
    return {n: float(t.double().norm()) for n, t in params.items()}


def weighted_reference(pa: dict, pb: dict, weighting: str, token_weights: torch.Tensor | None = None, *,
                       norms: tuple[dict, dict] | None = None, rows: dict | None = None) -> dict:
    """A's parameters scaled so that sum_p <A'_p, g.B_p> is the chosen objective.

    "sum": sum_p <A_p, g.B_p> (A unchanged): the largest tensors dominate, and on the ViT
    the embeddings that fix the residual basis weigh under 1% of it. "per_tensor": each term
    divided by ||A_p|| ||B_p||, a sum of cosines where every tensor counts equally; "sqrt":
    divided by sqrt(||A_p|| ||B_p||), halfway between the two on a log scale. The norms
    are taken once, at g = identity (orthogonal maps and permutations keep them), so the
    objective stays linear in g.B and every solver works on it unchanged. `token_weights`
    (see `token_weights`) then scale the rows of the token embedding and LM head.

    A streamed model gives its parameters a block at a time: `norms` (A's, B's, of whole tensors)
    and `rows` ({name: (start, stop)} of the parameters given as a block of rows) say where a block lies."""
    if weighting not in WEIGHTINGS:
        raise ValueError(f"weighting must be one of {WEIGHTINGS}, got {weighting!r}")
    if token_weights is not None:
        return _with_token_prior(weighted_reference(pa, pb, weighting, norms=norms, rows=rows), token_weights,
                                 rows or {})
    if weighting == "sum":
        return pa
    na, nb = norms if norms is not None else (tensor_norms(pa), tensor_norms(pb))
    out = {}
    for n, a in pa.items():
        scale = torch.tensor(na[n] * nb[n], dtype=torch.float64)
        scale = scale.sqrt() if weighting == "sqrt" else scale
        out[n] = a / scale.to(a.dtype) if scale > 0 else torch.zeros_like(a)  # a zero tensor adds nothing
    return out
