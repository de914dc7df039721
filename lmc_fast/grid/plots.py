"""The grid's two figures: the barrier of every pair per method, and every interpolation curve."""
from __future__ import annotations

import math
from pathlib import Path

from ..plots import _COLOURS, _plt, _save


def _colour(method: str, k: int, palette) -> str:
    return _COLOURS.get(method, palette[k % len(palette)])


def _finite(v) -> float:
    return math.nan if v is None else float(v)


def plot_barriers(records: list[dict], methods, path: Path, dpi: int = 120) -> Path:
    """One column per method, one dot per pair (spread sideways so none hides another), a grey line
    joining each pair's dots across methods, and the median as a bar."""
    plt = _plt()
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    pairs = sorted({tuple(r["pair"]) for r in records})
    fig, ax = plt.subplots(figsize=(max(5.0, 1.4 * len(methods) + 2), 4.2), dpi=dpi)
    spread = 0.3
    offset = {p: (spread * (k / (len(pairs) - 1) - spread / 2) if len(pairs) > 1 else 0.0)
              for k, p in enumerate(pairs)}
    by = {(tuple(r["pair"]), r["method"]): _finite(r["barrier"]) for r in records}
    for p in pairs:  # a pair's path across the methods
        xs = [x + offset[p] for x, m in enumerate(methods) if (p, m) in by]
        ys = [by[(p, m)] for m in methods if (p, m) in by]
        ax.plot(xs, ys, color="0.8", lw=0.8, zorder=1)
    for x, m in enumerate(methods):
        ys = [(offset[p], by[(p, m)]) for p in pairs if (p, m) in by]
        ax.scatter([x + o for o, _ in ys], [y for _, y in ys], s=22, color=_colour(m, x, palette), zorder=3,
                   edgecolor="black", linewidth=0.4)
        finite = sorted(y for _, y in ys if math.isfinite(y))
        if finite:
            med = finite[len(finite) // 2] if len(finite) % 2 else 0.5 * (finite[len(finite) // 2 - 1] +
                                                                          finite[len(finite) // 2])
            ax.hlines(med, x - 0.25, x + 0.25, color="black", lw=1.5, zorder=2)
    ax.set_xticks(range(len(methods)), list(methods))
    ax.set_xlim(-0.6, len(methods) - 0.4)
    ax.axhline(0.0, color="0.5", lw=0.6, ls=":")
    ax.set_ylabel("loss barrier")
    ax.set_title(f"loss barrier per method ({len(pairs)} pairs; bar = median)")
    fig.tight_layout()
    try:
        return _save(fig, path)
    finally:
        plt.close(fig)


def plot_grid_curves(records: list[dict], methods, path: Path, dpi: int = 120) -> Path:
    """Loss (top) and accuracy (bottom) against lambda, one column per method, one line per pair."""
    plt = _plt()
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    n = len(methods)
    fig, axes = plt.subplots(2, n, figsize=(3.2 * n + 0.6, 5.6), dpi=dpi, squeeze=False, sharey="row")
    for x, m in enumerate(methods):
        colour = _colour(m, x, palette)
        for r in (r for r in records if r["method"] == m):
            c = r["curve"]
            axes[0][x].plot(c["lambdas"], [_finite(v) for v in c["loss"]], color=colour, lw=1, alpha=0.7)
            axes[1][x].plot(c["lambdas"], [_finite(v) for v in c["acc"]], color=colour, lw=1, alpha=0.7)
        axes[0][x].set_title(m)
        axes[1][x].set_xlabel("lambda")
    axes[0][0].set_ylabel("loss")
    axes[1][0].set_ylabel("accuracy")
    fig.suptitle("linear paths, one line per pair")
    fig.tight_layout()
    try:
        return _save(fig, path)
    finally:
        plt.close(fig)


__all__ = ["plot_barriers", "plot_grid_curves"]
