"""Model fingerprints: which two models an alignment was computed for.

An alignment only means something for the pair it was matched on; applied to another model
it silently permutes / rotates unrelated weights. `lf.align` records both fingerprints and
`Alignment.verify_models` checks them before a sweep.
"""
from __future__ import annotations

import hashlib

import torch

from ..models.adapters import standard_params

#: Hex characters kept: 64 bits is plenty to tell checkpoints apart.
FINGERPRINT_CHARS = 16


def model_fingerprint(model) -> str:
    """Short hex SHA-256 of the model's standard parameters (names sorted, each cast to
    float32): the same for a model's float32 / float64 copies and for HF vs reference classes
    holding the same weights; different after any training step."""
    _, params = standard_params(model)
    digest = hashlib.sha256()
    for name in sorted(params):
        t = params[name].detach().to(device="cpu", dtype=torch.float32).contiguous()
        digest.update(f"{name}:{tuple(t.shape)};".encode())
        digest.update(t.numpy().tobytes())
    return digest.hexdigest()[:FINGERPRINT_CHARS]
