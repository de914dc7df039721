"""Figures (matplotlib, Agg backend; PNG, PDF or SVG by the file's suffix): interpolation curves, simplex heat-maps, calibration.

    from lmc_fast.plots import plot_calibration, plot_curves, plot_simplex
    plot_curves({"none": res_raw, "weight": res_weight}, "curves.png")   # BarrierResult or its dict
    plot_simplex(lf.simplex([m0, m1, m2], data), "simplex.png")
    plot_calibration({"weight": res_weight}, "calibration.png")         # ECE + reliability diagrams
    overlay_curves([("none", json.load(open("none.json"))), ("w", json.load(open("w.json")))], "both.png")

Result JSONs are validated before anything is drawn (`result_curves`, `result_simplex`,
`result_calibration`):
a file that is not a result raises ValueError naming what is wrong. Every figure is written atomically (temporary file next to the target, then renamed).
"""
from __future__ import annotations

import math
from pathlib import Path

from .atomic import atomic_file

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


def _floats(values) -> list[float]:
    """null (a NaN in strict JSON) -> nan, which matplotlib leaves as a gap."""
    return [math.nan if v is None else float(v) for v in values]


#: the figure formats, by file suffix (each one the Agg backend writes)
FIGURE_FORMATS = ("png", "pdf", "svg")


def figure_format(path) -> str:
    """The format a figure at `path` is written in, from its suffix; a ValueError for any other
    suffix (a PNG named x.pdf, or x.jpg, would be bytes its name misstates)."""
    fmt = Path(path).suffix.lower().removeprefix(".")
    if fmt not in FIGURE_FORMATS:
        raise ValueError(f"{path}: a figure's name must end in {', '.join('.' + f for f in FIGURE_FORMATS)} "
                         f"(its format), got {('.' + fmt) if fmt else 'no suffix'}")
    return fmt


def _save(fig, path) -> Path:
    path = Path(path)
    fmt = figure_format(path)
    with atomic_file(path, suffix="." + fmt) as tmp:
        fig.savefig(tmp, format=fmt, dpi=fig.dpi, bbox_inches="tight")
    return path


def _finish(fig, path, title: str | None) -> Path:
    """Title, layout, atomic save; the figure is closed whatever happens."""
    plt = _plt()
    try:
        if title:
            fig.suptitle(title)
        fig.tight_layout()
        return _save(fig, path)
    finally:
        plt.close(fig)


def _named_results(results, who: str) -> dict:
    """name -> result dict, from one result (BarrierResult or dict) or a dict of them."""
    if not isinstance(results, dict) or "lambdas" in results:
        results = {"path": results}
    results = {name: _as_dict(r) for name, r in results.items()}
    if not results:
        raise ValueError(f"{who} needs at least one result")
    return results


def plot_curves(results, path, title: str | None = None, dpi: int = 120) -> Path:
    """Loss and accuracy against lambda for one or several paths (a dict name -> result, or
    one result). Each method's chord between its end points is drawn dashed in its colour."""
    plt = _plt()
    results = _named_results(results, "plot_curves")
    has_acc = any(r.get("acc") for r in results.values())
    fig, axes = plt.subplots(1, 2 if has_acc else 1, figsize=(11 if has_acc else 6, 4.2), dpi=dpi, squeeze=False)
    ax_loss = axes[0][0]
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    used = set()
    for i, (name, r) in enumerate(results.items()):
        lams = r["lambdas"]
        colour = _colour(name, i, palette, used)
        label = f"{name} (barrier {r['barrier']:.3f})" if r.get("barrier") is not None else name
        ax_loss.plot(lams, _floats(r["loss"]), "-o", color=colour, ms=3, lw=1.6, label=label)
        if r.get("loss_a") is not None and r.get("loss_b") is not None:
            ax_loss.plot([0, 1], [r["loss_a"], r["loss_b"]], "--", color=colour, lw=1, alpha=0.7)
        if has_acc and r.get("acc"):
            ax = axes[0][1]
            ax.plot(lams, [100 * a for a in _floats(r["acc"])], "-o", color=colour, ms=3, lw=1.6, label=name)
            if r.get("acc_a") is not None and r.get("acc_b") is not None:
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
    return _finish(fig, path, title)


def _colour(name: str, i: int, palette, used: set) -> str:
    """The method's own colour (by the name's first word); a free palette colour when that one
    is taken (two overlaid files with the same method must stay distinguishable)."""
    colour = _COLOURS.get(name.split()[0] if name.split() else name)
    if colour is None or colour in used:
        free = [c for c in palette if c not in used and c not in _COLOURS.values()] or palette
        colour = free[i % len(free)] if colour is None else free[0]
    used.add(colour)
    return colour


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


# ---------------------------------------------------------------- result files
def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _numbers(x, n: int | None = None, gaps: bool = False) -> bool:
    """A list of numbers (of length n); with `gaps`, null entries too (strict JSON writes NaN as null)."""
    ok = (lambda v: _is_number(v) or v is None) if gaps else _is_number
    return isinstance(x, list) and all(ok(v) for v in x) and (n is None or len(x) == n)


def _check_curve(name: str, c) -> None:
    if not isinstance(c, dict):
        raise ValueError(f"curve {name!r} is not an object")
    lams, loss = c.get("lambdas"), c.get("loss")
    if not _numbers(lams) or not lams or not _numbers(loss, len(lams), gaps=True):
        raise ValueError(f"curve {name!r}: 'lambdas' and 'loss' must be non-empty lists of numbers of equal length")
    if c.get("acc") and not _numbers(c["acc"], len(lams), gaps=True):
        raise ValueError(f"curve {name!r}: 'acc' must be a list of {len(lams)} numbers")
    for key in ("barrier", "loss_a", "loss_b", "acc_a", "acc_b"):
        if c.get(key) is not None and not _is_number(c[key]):
            raise ValueError(f"curve {name!r}: {key!r} must be a number")


def result_curves(result: dict) -> dict:
    """The barrier curves (name -> curve) of a result JSON written by the CLI or
    `BarrierResult.to_dict()`, validated; {} when it has none."""
    if not isinstance(result, dict):
        raise ValueError("not a result object")
    if "results" in result:
        curves = result["results"]
        if not isinstance(curves, dict):
            raise ValueError("'results' must map names to curves")
    elif "lambdas" in result:
        curves = {"path": result}
    else:
        return {}
    for name, c in curves.items():
        _check_curve(name, c)
    return curves


def _check_row(where: str, row, n: int) -> None:
    if not isinstance(row, dict) or not _numbers(row.get("weights"), n) or not _is_number(row.get("loss")):
        raise ValueError(f"simplex {where}: needs 'weights' ({n} numbers) and a numeric 'loss'")


def result_simplex(result: dict) -> dict | None:
    """The simplex sweep (`lf.simplex` output) in a result JSON, validated; None when absent."""
    simplex = result.get("simplex") if isinstance(result.get("simplex"), dict) else (
        result if "centroid" in result else None)
    if simplex is None:
        return None
    models = simplex.get("models")
    if not isinstance(models, list) or len(models) < 2:
        raise ValueError("simplex: 'models' must list at least two rows")
    n = len(models)
    samples = simplex.get("samples", [])
    if not isinstance(samples, list):
        raise ValueError("simplex: 'samples' must be a list")
    for i, row in enumerate(models):
        _check_row(f"model {i}", row, n)
    _check_row("centroid", simplex.get("centroid"), n)
    for i, row in enumerate(samples):
        _check_row(f"sample {i}", row, n)
    if simplex.get("worst") is not None:
        _check_row("worst", simplex["worst"], n)
    return simplex


def _figures(result: dict, path: Path) -> list:
    """(kind, target path, data) of every figure a result JSON yields."""
    if result.get("kind") == "plane":  # `lmc-fast plane`: its contour panels
        for name, p in (result.get("planes") or {}).items():
            _check_plane(name, p)
        if not result.get("planes"):
            raise ValueError("nothing to plot: the plane result holds no planes")
        return [("plane", path, result)]
    curves, simplex = result_curves(result), result_simplex(result)
    out = []
    if curves:
        out.append(("curves", path, curves))
    if simplex is not None and len(simplex["models"]) == 3:
        out.append(("simplex", path if not out else path.with_name(path.stem + "_simplex" + path.suffix), simplex))
    if not out:
        raise ValueError("nothing to plot: the JSON has neither barrier curves ('results'/'lambdas') "
                         "nor a 3-model simplex sweep")
    return out


def result_figures(result: dict, path) -> list[Path]:
    """The files `plot_result_file(result, path)` would write (validates the result; draws nothing)."""
    return [target for _, target, _ in _figures(result, Path(path))]


def plot_result_file(result: dict, path, title: str | None = None) -> list[Path]:
    """Figures for a JSON result written by the CLI: curves for "results", a ternary map for
    "simplex" (beside the curves as NAME_simplex.png when there are both)."""
    written = []
    for kind, target, data in _figures(result, Path(path)):
        draw = {"curves": plot_curves, "simplex": plot_simplex, "plane": plot_plane}[kind]
        written.append(draw(data, target, title=title))
    return written


def overlay_curves(named_results, path, title: str | None = None) -> Path:
    """One figure with the barrier curves of several result JSONs: `named_results` is a list of
    (label, result); a curve is named "<curve> (<label>)" when curve names repeat across files."""
    named_results = list(named_results)
    per_file = [(label, result_curves(result)) for label, result in named_results]
    for label, curves in per_file:
        if not curves:
            raise ValueError(f"{label}: no barrier curves to overlay")
    names = [name for _, curves in per_file for name in curves]
    repeated = len(set(names)) != len(names)
    merged = {}
    for label, curves in per_file:
        for name, c in curves.items():
            merged[f"{name} ({label})" if repeated else name] = c
    return plot_curves(merged, path, title=title)


# ---------------------------------------------------------------- calibration
#: the lambdas whose reliability diagrams `plot_calibration` draws (each at the nearest grid point)
CALIBRATION_LAMBDAS = (0.0, 0.5, 1.0)


def _check_reliability(name: str, c: dict) -> None:
    """`c` (a validated curve) carries 'ece' and a well-formed 'reliability' per lambda."""
    n = len(c["lambdas"])
    rel = c.get("reliability")
    if rel is None or c.get("ece") is None:
        raise ValueError(f"curve {name!r} has no calibration data ('ece' and 'reliability' per lambda): "
                         "the result predates it; re-run the sweep to record it")
    if not _numbers(c["ece"], n, gaps=True):
        raise ValueError(f"curve {name!r}: 'ece' must be a list of {n} numbers")
    if not isinstance(rel, list) or len(rel) != n:
        raise ValueError(f"curve {name!r}: 'reliability' must list one diagram per lambda ({n})")
    for i, d in enumerate(rel):
        bins = len(d.get("n") or []) if isinstance(d, dict) else 0
        if (not bins or not _numbers(d["n"]) or any(v < 0 for v in d["n"])
                or not _numbers(d.get("conf"), bins, gaps=True) or not _numbers(d.get("acc"), bins, gaps=True)):
            raise ValueError(f"curve {name!r}: reliability {i} needs 'conf', 'acc' and 'n' "
                             "(lists of one number per bin, counts >= 0)")


def result_calibration(result: dict) -> dict:
    """The barrier curves of a result JSON that carry calibration data, validated (ValueError
    when there are no curves or one lacks 'ece' / 'reliability')."""
    curves = result_curves(result)
    if not curves:
        raise ValueError("no barrier curves, so no calibration to plot (only sweep and demo results have them)")
    for name, c in curves.items():
        _check_reliability(name, c)
    return curves


def _nearest(lams, target: float) -> int:
    return min(range(len(lams)), key=lambda j: (abs(lams[j] - target), j))


def plot_calibration(results, path, title: str | None = None, dpi: int = 120) -> Path:
    """Calibration along the path for one or several results (a dict name -> result, or one
    result; BarrierResult or its dict): ECE against lambda (left), and reliability diagrams
    (accuracy against mean confidence per bin, the diagonal being perfect calibration; marker
    area by the bin's share of the examples) at lambda 0, 0.5 and 1, each at the nearest grid
    point, which the panel names when it differs."""
    plt = _plt()
    results = _named_results(results, "plot_calibration")
    for name, c in results.items():
        _check_curve(name, c)
        _check_reliability(name, c)
    fig, axes = plt.subplots(1, 1 + len(CALIBRATION_LAMBDAS), figsize=(17, 4.4), dpi=dpi, squeeze=False,
                             gridspec_kw={"width_ratios": [1.5] + [1] * len(CALIBRATION_LAMBDAS)})
    ax_ece, rel_axes = axes[0][0], axes[0][1:]
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    markers = "osD^vP*X"
    used = set()
    chosen = [set() for _ in CALIBRATION_LAMBDAS]
    for i, (name, r) in enumerate(results.items()):
        lams = r["lambdas"]
        colour = _colour(name, i, palette, used)
        marker = markers[i % len(markers)]
        ax_ece.plot(lams, [100 * e for e in _floats(r["ece"])], "-", marker=marker, color=colour, ms=3, lw=1.6,
                    label=name)
        for k, (target, ax) in enumerate(zip(CALIBRATION_LAMBDAS, rel_axes)):
            j = _nearest(lams, target)
            chosen[k].add(lams[j])
            d = r["reliability"][j]
            total = sum(d["n"]) or 1
            pts = [(c, a, n) for c, a, n in zip(d["conf"], d["acc"], d["n"]) if c is not None and a is not None and n]
            ece = r["ece"][j]
            label = f"{name}: ECE {100 * ece:.1f}%" if _is_number(ece) else name
            if len(results) > 1 and len({r2["lambdas"][_nearest(r2["lambdas"], target)] for r2 in results.values()}) > 1:
                label += f" (λ={lams[j]:.3g})"
            if pts:
                cs, accs, ns = zip(*pts)
                ax.plot(cs, accs, "-", color=colour, lw=0.8, alpha=0.6)
                ax.scatter(cs, accs, s=[12 + 400 * n / total for n in ns], marker=marker,
                           color=colour, alpha=0.75, edgecolors="k", linewidths=0.4, zorder=3)
            ax.plot([], [], marker, color=colour, mec="k", mew=0.4, label=label if pts else label + " (no examples)")
    ax_ece.set_xlabel(r"$\lambda$  (model A at 0, model B at 1)")
    ax_ece.set_ylabel("ECE (%, 15 bins)")
    ax_ece.set_title("expected calibration error along the path")
    ax_ece.grid(alpha=0.3)
    ax_ece.legend(fontsize=8)
    for target, ax, got in zip(CALIBRATION_LAMBDAS, rel_axes, chosen):
        ax.plot([0, 1], [0, 1], "k--", lw=1, alpha=0.6, label="perfect calibration")
        at = sorted(got)
        if at == [target]:
            ax.set_title(f"reliability at λ = {target:g}")
        else:
            ax.set_title(f"reliability at λ ≈ {target:g} (nearest grid point: {', '.join(f'{v:.3g}' for v in at)})",
                         fontsize=9)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_xlabel("mean confidence in bin")
        ax.set_ylabel("accuracy in bin")
        ax.set_aspect("equal")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    fig.text(0.99, 0.005, "marker area: share of the examples in the bin", ha="right", fontsize=7, alpha=0.7)
    return _finish(fig, path, title)


def calibration_results(named_results) -> dict:
    """name -> curve of every curve of several result JSONs ((label, result) pairs), each with
    calibration data; named "<curve> (<label>)" when curve names repeat across files."""
    per_file = []
    for label, result in named_results:
        try:
            per_file.append((label, result_calibration(result)))
        except ValueError as exc:
            raise ValueError(f"{label}: {exc}") from None
    names = [name for _, curves in per_file for name in curves]
    repeated = len(set(names)) != len(names)
    return {f"{name} ({label})" if repeated else name: c for label, curves in per_file for name, c in curves.items()}


def _check_plane(name: str, p) -> None:
    if not isinstance(p, dict):
        raise ValueError(f"plane {name!r}: not an object")
    n = len(p.get("x", ()))
    if not (_numbers(p.get("x"), n) and _numbers(p.get("y"), len(p.get("y", ()))) and n >= 2
            and isinstance(p.get("loss"), list) and len(p["loss"]) == len(p["y"])
            and all(_numbers(row, n, gaps=True) for row in p["loss"])):
        raise ValueError(f"plane {name!r}: needs x, y and an len(y) x len(x) loss grid of numbers")
    models = p.get("models")
    if not (isinstance(models, list) and len(models) == 3
            and all(isinstance(m, dict) and _is_number(m.get("x")) and _is_number(m.get("y")) for m in models)):
        raise ValueError(f"plane {name!r}: needs the three models' x and y")


def plot_plane(result: dict, path, title: str | None = None, dpi: int = 120) -> Path:
    """Loss contours of each plane in `result["planes"]` side by side (e.g. raw and aligned), the models
    marked and labelled (`result["labels"]`) and the linear paths between them drawn."""
    planes = result.get("planes") if isinstance(result, dict) else None
    if not isinstance(planes, dict) or not planes:
        raise ValueError("a plane result needs 'planes': {name: lf.plane(...) result}")
    for name, p in planes.items():
        _check_plane(name, p)
    labels = result.get("labels") or ["A", "B", "C"]
    plt = _plt()
    fig, axes = plt.subplots(1, len(planes), figsize=(5.2 * len(planes), 4.4), dpi=dpi, squeeze=False)
    grids = {name: [[math.nan if v is None else float(v) for v in row] for row in p["loss"]]
             for name, p in planes.items()}
    finite = sorted(v for loss in grids.values() for row in loss for v in row if math.isfinite(v))
    if not finite:
        raise ValueError("plane: no finite loss to draw")
    # one colour scale for every panel (raw and aligned compare by colour); a few huge corners would flatten the rest
    top = finite[min(len(finite) - 1, int(0.95 * len(finite)))]
    levels = [finite[0] + (top - finite[0]) * i / 20 for i in range(21)] if top > finite[0] else None
    try:
        for ax, (name, p) in zip(axes[0], planes.items()):
            loss = grids[name]
            cs = ax.contourf(p["x"], p["y"], [[min(v, top) for v in row] for row in loss], levels=levels,
                             cmap="viridis")
            fig.colorbar(cs, ax=ax, label="loss")
            xy = [(m["x"], m["y"]) for m in p["models"]]
            for i, j in ((0, 1), (0, 2), (1, 2)):
                ax.plot([xy[i][0], xy[j][0]], [xy[i][1], xy[j][1]], color="white", lw=1, ls="--")
            for (x, y), label in zip(xy, p.get("labels") or labels):
                ax.plot([x], [y], "o", color="white", mec="black", ms=7)
                ax.annotate(label, (x, y), textcoords="offset points", xytext=(6, 6), color="white", fontsize=9)
            ax.set_title(name)
            ax.set_aspect("equal")
            ax.set_xlabel("x (parameter-space distance)")
            ax.set_ylabel("y")
    except Exception:
        plt.close(fig)
        raise
    return _finish(fig, path, title)
