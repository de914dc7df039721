"""`lmc-fast plot`: PNG from result JSONs (sweep, demo, merge or plane); several sweeps are overlaid."""
from __future__ import annotations

import json
from pathlib import Path

from .args import add_command
from .console import CLIError, Console, one_line
from .outputs import Outputs


def register(subparsers, parents):
    # no shared options (no --device, --seed, --threads): plot has its own -q
    pl = add_command(subparsers, "plot", "PNG from result JSONs (sweep, demo, merge or plane); several sweeps are overlaid", ())
    pl.add_argument("results", nargs="+", metavar="RESULT", help="result JSON file(s)")
    pl.add_argument("--out", default=None,
                    help="PNG path (default: the JSON's name with .png, or with _calibration.png under "
                         "--calibration; required for several results)")
    pl.add_argument("--calibration", action="store_true",
                    help="draw the calibration view instead of the curves: ECE along the path and reliability "
                         "diagrams at lambda 0, 0.5, 1 (nearest grid points); several results are overlaid "
                         "(default: off)")
    pl.add_argument("--title", default=None, help="figure title (default: none)")
    pl.add_argument("-q", "--quiet", action="store_true", help="print nothing but the written paths")


def _read_result(path: Path) -> dict:
    """A result JSON written by this CLI (sweep, demo, merge, plane), or a CLIError naming the file."""
    if not path.is_file():
        raise CLIError(f"{path}: no such file")
    try:
        result = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CLIError(f"{path}: not a JSON result ({one_line(exc)})") from None
    except RecursionError:
        raise CLIError(f"{path}: not a JSON result (nested too deeply to read)") from None
    if not isinstance(result, dict):
        raise CLIError(f"{path}: not a JSON result object (a sweep, demo, merge or plane result)")
    return result


def run(args, con: Console) -> int:
    from ..plots import overlay_curves, plot_result_file, result_figures

    paths = [Path(p) for p in args.results]
    if len(paths) > 1 and not args.out:
        raise CLIError("--out is required when plotting several results (they are overlaid in one figure)")
    if args.calibration:
        return _run_calibration(args, paths, con)
    out = Path(args.out) if args.out else paths[0].with_suffix(".png")
    results = [_read_result(p) for p in paths]
    for path, result in zip(paths, results):
        _check_plottable(path, result, overlay=len(paths) > 1)
    targets = result_figures(results[0], out) if len(paths) == 1 else [out]
    outputs = Outputs(paths)
    for target in targets:
        outputs.figure("--out", target)
    outputs.check()
    if len(paths) == 1:
        written = plot_result_file(results[0], out, title=args.title)
    else:
        written = [overlay_curves(list(zip(_labels(paths), results)), out, title=args.title)]
    for p in written:
        con.out(f"plot -> {p}")
    return 0


def _check_plottable(path: Path, result: dict, overlay: bool):
    from ..plots import result_curves, result_figures

    try:
        if overlay and not result_curves(result):
            raise ValueError("has no barrier curves to overlay (only sweep and demo results have them)")
        result_figures(result, path.with_suffix(".png"))
    except ValueError as exc:
        raise CLIError(f"{path}: {one_line(exc)}") from None


def _labels(paths) -> list[str]:
    """Short distinct labels for overlaid files: their stems, or their paths when stems repeat."""
    stems = [p.stem for p in paths]
    return stems if len(set(stems)) == len(stems) else [str(p) for p in paths]


def _run_calibration(args, paths, con: Console) -> int:
    """`plot --calibration`: one figure, ECE curves and reliability diagrams of every result's curves."""
    from ..plots import calibration_results, plot_calibration, result_calibration

    out = Path(args.out) if args.out else paths[0].with_name(paths[0].stem + "_calibration.png")
    results = [_read_result(p) for p in paths]
    for path, result in zip(paths, results):
        try:
            result_calibration(result)
        except ValueError as exc:
            raise CLIError(f"{path}: {one_line(exc)}") from None
    outputs = Outputs(paths)
    outputs.figure("--out", out)
    outputs.check()
    curves = calibration_results(list(zip(_labels(paths), results)))
    con.out(f"plot -> {plot_calibration(curves, out, title=args.title)}")
    return 0
