"""PNG figures (matplotlib, Agg backend): interpolation curves and simplex heat-maps.

    from lmc_fast.plots import plot_curves, plot_simplex
    plot_curves({"none": res_raw, "weight": res_weight}, "curves.png")   # BarrierResult or its dict
    plot_simplex(lf.simplex([m0, m1, m2], data), "simplex.png")

Every figure is written atomically (temporary file next to the target, then renamed).
"""
from __future__ import annotations

import math
from pathlib import Path

from .io import atomic_file

# colour per method name (anything else cycles through the default palette)
_COLOURS = {"none": "#7f7f7f", "permutation": "#ff7f0e", "weight": "#1f77b4", "activation": "#2ca02c",
            "learned": "#d62728"}


def _plt():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _as_dict(res) -> dict:
    return res.to_dict() if hasattr(res, "to_dict") else dict(res)


def _save(fig, path) -> Path:
    path = Path(path)
    with atomic_file(path, suffix=".png") as tmp:
        fig.savefig(tmp, format="png", dpi=fig.dpi, bbox_inches="tight")
    return path


def plot_curves(results, path, title: str | None = None, dpi: int = 120) -> Path:
    """Loss and accuracy against lambda for one or several paths (a dict name -> result, or
    one result). Each method's chord between its end points is drawn dashed in its colour."""
    plt = _plt()
    if not isinstance(results, dict) or "lambdas" in results:
        results = {"path": results}
    results = {name: _as_dict(r) for name, r in results.items()}
    if not results:
        raise ValueError("plot_curves needs at least one result")
    has_acc = any(r.get("acc") for r in results.values())
    fig, axes = plt.subplots(1, 2 if has_acc else 1, figsize=(11 if has_acc else 6, 4.2), dpi=dpi, squeeze=False)
    ax_loss = axes[0][0]
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (name, r) in enumerate(results.items()):
        lams = r["lambdas"]
        colour = _COLOURS.get(name.split()[0], palette[i % len(palette)])
        label = f"{name} (barrier {r['barrier']:.3f})" if "barrier" in r else name
        ax_loss.plot(lams, r["loss"], "-o", color=colour, ms=3, lw=1.6, label=label)
        if "loss_a" in r and "loss_b" in r:
            ax_loss.plot([0, 1], [r["loss_a"], r["loss_b"]], "--", color=colour, lw=1, alpha=0.7)
        if has_acc and r.get("acc"):
            ax = axes[0][1]
            ax.plot(lams, [100 * a for a in r["acc"]], "-o", color=colour, ms=3, lw=1.6, label=name)
            if "acc_a" in r and "acc_b" in r:
                ax.plot([0, 1], [100 * r["acc_a"], 100 * r["acc_b"]], "--", color=colour, lw=1, alpha=0.7)
    ax_loss.set_xlabel(r"$\lambda$  (model A at 0, aligned model B at 1)")
    ax_loss.set_ylabel("test loss")
    ax_loss.set_title("loss along the linear path (dashed: chord)")
    ax_loss.grid(alpha=0.3)
    ax_loss.legend(fontsize=8)
    if has_acc:
        ax = axes[0][1]
        ax.set_xlabel(r"$\lambda$")
        ax.set_ylabel("test accuracy (%)")
        ax.set_title("accuracy along the linear path")
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    try:
        return _save(fig, path)
    finally:
        plt.close(fig)


def _xy(w):
    """Barycentric (w0, w1, w2) -> 2-D point in an equilateral triangle (model 0 bottom left)."""
    return w[1] + 0.5 * w[2], (math.sqrt(3) / 2) * w[2]


def plot_simplex(result: dict, path, metric: str = "loss", labels=None, title: str | None = None,
                 dpi: int = 120) -> Path:
    """Ternary heat-map of a 3-model `lf.simplex` result: `metric` ("loss", "acc", "excess")
    interpolated over the evaluated points; the models, the centroid and the worst sample marked."""
    plt = _plt()
    import matplotlib.tri as mtri

    rows = list(result["models"]) + [result["centroid"]] + list(result.get("samples", []))
    if len(result["models"]) != 3:
        raise ValueError(f"a ternary plot needs exactly 3 models, got {len(result['models'])}")
    if metric not in rows[0]:
        raise ValueError(f"metric {metric!r} not in the simplex result (have {sorted(rows[0])})")
    xs, ys = zip(*(_xy(r["weights"]) for r in rows))
    vals = [100 * r[metric] if metric == "acc" else r[metric] for r in rows]
    fig, ax = plt.subplots(figsize=(6.2, 5.4), dpi=dpi)
    tri = mtri.Triangulation(xs, ys)
    cmap = "viridis_r" if metric == "acc" else "viridis"
    levels = 14 if max(vals) > min(vals) else None
    if levels:
        cs = ax.tricontourf(tri, vals, levels=levels, cmap=cmap)
    else:
        cs = ax.tripcolor(tri, vals, cmap=cmap)
    cbar = fig.colorbar(cs, ax=ax, shrink=0.8)
    cbar.set_label({"loss": "loss", "acc": "accuracy (%)", "excess": "loss - mixture of end losses"}.get(metric, metric))
    ax.plot([0, 1, 0.5, 0], [0, 0, math.sqrt(3) / 2, 0], "k-", lw=1)
    ax.scatter(xs[4:], ys[4:], s=6, c="white", edgecolors="k", linewidths=0.3, zorder=3, label="samples")
    ax.scatter([xs[3]], [ys[3]], marker="*", s=120, c="w", edgecolors="k", zorder=4, label="centroid")
    worst = result.get("worst")
    if worst:
        wx, wy = _xy(worst["weights"])
        ax.scatter([wx], [wy], marker="X", s=80, c="red", edgecolors="k", zorder=4, label="worst sample")
    labels = labels or [f"model {i}" for i in range(3)]
    for (x, y), text, (dx, dy, ha) in zip([(0, 0), (1, 0), (0.5, math.sqrt(3) / 2)], labels,
                                          [(-0.02, -0.05, "right"), (0.02, -0.05, "left"), (0, 0.03, "center")]):
        ax.text(x + dx, y + dy, text, ha=ha, fontsize=9)
    ax.set_aspect("equal")
    ax.set_xlim(-0.15, 1.15)
    ax.set_ylim(-0.1, 0.98)
    ax.axis("off")
    ax.legend(loc="upper right", fontsize=7)
    ax.set_title(title or f"simplex sweep: {metric} (centroid {rows[3][metric]:.3f})")
    try:
        return _save(fig, path)
    finally:
        plt.close(fig)


def plot_result_file(result: dict, path, title: str | None = None) -> list[Path]:
    """Figures for a JSON result written by the CLI: curves for "results", a ternary map for "simplex"."""
    out = []
    path = Path(path)
    if isinstance(result.get("results"), dict) and result["results"]:
        out.append(plot_curves(result["results"], path, title=title))
    elif "lambdas" in result:
        out.append(plot_curves({"path": result}, path, title=title))
    simplex = result.get("simplex") or (result if "centroid" in result else None)
    if simplex is not None and len(simplex.get("models", [])) == 3:
        target = path if not out else path.with_name(path.stem + "_simplex.png")
        out.append(plot_simplex(simplex, target, title=title))
    if not out:
        raise ValueError("nothing to plot: the JSON has neither barrier curves ('results'/'lambdas') "
                         "nor a 3-model simplex sweep")
    return out
