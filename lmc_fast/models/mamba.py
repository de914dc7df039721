"""Mamba's mixer (Gu & Dao's selective state space block) over K stacked parameter sets, in plain torch.

`functional.block` calls `mixer` for Arch.mixer "mamba": h <- h + mixer(ln1 h). Per token t and inner
channel i (d_inner of them), state n (d_state), with x = ln1 h:

    u = act(causal depthwise conv(in_x x) + conv.bias)        the inner channels
    z = in_z x                                                the gate
    dt = softplus(dt(x_dt u))    B = x_B u    C = x_C u        input-dependent step and state maps
    s_t[i, n] = exp(dt_t[i] A[i, n]) s_{t-1}[i, n] + dt_t[i] B_t[n] u_t[i],   A = -exp(A_log)
    y_t[i] = sum_n s_t[i, n] C_t[n] + D[i] u_t[i]
    out = out(y * silu(z))

as Hugging Face's MambaMixer computes it on its torch path (its float32 casts aside: this runs in the
parameters' dtype, float64 included). Linear layers go through `ops.linear` (so a sweep's mixing ops
run it); the conv, A_log and D through `ops.tensor`. `record` sees the inner channels u under "inner.L"
and the state maps B and C (one after the other along the tokens) under "state.L": the activations the
two permutation groups of docs/ARCHITECTURE.md, section 1, move and nothing else does.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .blocks import ACTIVATIONS


def causal_conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """Depthwise causal conv along the tokens: x (K, B, T, E), weight (K, E, k), bias (K, E) ->
    y[t, e] = sum_j weight[e, j] x[t - (k - 1) + j, e] (+ bias[e]), zeros before the first token."""
    K, B, T, E = x.shape
    k = weight.shape[-1]
    xp = F.pad(x, (0, 0, k - 1, 0))  # k - 1 zero tokens in front
    w = weight.transpose(1, 2)[:, None, :, None, :]  # (K, 1, k, 1, E)
    y = sum(w[:, :, j] * xp[:, :, j:j + T] for j in range(k))
    return y if bias is None else y + bias[:, None, None, :]


def selective_scan(u, dt, A, B, C, D) -> torch.Tensor:
    """y (K, b, T, E) of the recurrence above: u, dt (K, b, T, E); A (K, E, N); B, C (K, b, T, N); D (K, E).
    Step by step (the state (K, b, E, N) is all that is held), in the inputs' dtype."""
    K, b, T, E = u.shape
    s = u.new_zeros(K, b, E, A.shape[-1])
    A = A[:, None]  # (K, 1, E, N)
    ys = []
    for t in range(T):
        d = dt[:, :, t, :, None]  # (K, b, E, 1)
        s = torch.exp(d * A) * s + d * B[:, :, t, None, :] * u[:, :, t, :, None]
        ys.append((s * C[:, :, t, None, :]).sum(-1))
    return torch.stack(ys, dim=2) + u * D[:, None, None, :]


def mixer(arch, ops, l: int, x: torch.Tensor, record=None) -> torch.Tensor:
    """Block `l`'s Mamba mixer on its normalised input x (K, B, T, d) -> (K, B, T, d)."""
    b = f"blocks.{l}.mamba."
    conv_bias = ops.tensor(b + "conv.bias") if arch.conv_bias else None
    u = ACTIVATIONS[arch.activation](causal_conv(ops.linear(x, b + "in_x"), ops.tensor(b + "conv.weight"), conv_bias))
    z = ops.linear(x, b + "in_z")
    dt = F.softplus(ops.linear(ops.linear(u, b + "x_dt"), b + "dt"))
    B, C = ops.linear(u, b + "x_B"), ops.linear(u, b + "x_C")
    if record is not None:
        record(f"inner.{l}", u)
        record(f"state.{l}", torch.cat([B, C], dim=-2))
    y = selective_scan(u, dt, -torch.exp(ops.tensor(b + "A_log")), B, C, ops.tensor(b + "D"))
    return ops.linear(y * F.silu(z), b + "out")
