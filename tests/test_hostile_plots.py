"""Hostile figure paths: a figure is written in the format its name states (PNG, PDF, SVG), and a
name stating any other is refused in one line before anything is drawn (`plot --out x.pdf` wrote
PNG bytes under a .pdf name)."""
import json

import pytest

from lmc_fast.cli import main
from lmc_fast.plots import plot_curves

CURVE = {"lambdas": [0.0, 0.5, 1.0], "loss": [1.0, 2.0, 1.0], "acc": [0.9, 0.5, 0.9], "barrier": 1.0}
MAGIC = {"png": b"\x89PNG\r\n\x1a\n", "pdf": b"%PDF-", "svg": b"<?xml"}


@pytest.fixture
def result(tmp_path):
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"kind": "sweep", "results": {"weight": CURVE}}))
    return path


@pytest.mark.parametrize("fmt", ["pdf", "svg", "PDF"])
def test_plot_cli_writes_the_format_its_name_states(tmp_path, result, fmt):
    out = tmp_path / f"fig.{fmt}"
    assert main(["plot", str(result), "--out", str(out), "-q"]) == 0
    assert out.read_bytes().startswith(MAGIC[fmt.lower()])


@pytest.mark.parametrize("fmt", ["pdf", "svg"])
def test_plot_functions_write_the_format_their_path_states(tmp_path, fmt):
    out = plot_curves({"weight": CURVE}, tmp_path / f"c.{fmt}")
    assert out.read_bytes().startswith(MAGIC[fmt])


# (case id, command line after `lmc-fast`, with {r} the result and {w} the folder)
BAD_NAMES = [
    ("plot-jpg", ["plot", "{r}", "--out", "{w}/fig.jpg"]),
    ("plot-no-suffix", ["plot", "{r}", "--out", "{w}/fig"]),
    ("plot-txt", ["plot", "{r}", "--out", "{w}/fig.txt"]),
    ("plot-overlay-gif", ["plot", "{r}", "{r}", "--out", "{w}/both.gif"]),
]


@pytest.mark.parametrize("case", BAD_NAMES, ids=[c[0] for c in BAD_NAMES])
def test_a_figure_name_of_another_format_is_refused_in_one_line(tmp_path, result, capsys, case):
    _, argv = case
    argv = [a.format(r=result, w=tmp_path) for a in argv]
    rc = main(argv + ["-q"])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "a figure's name must end in .png, .pdf, .svg" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]  # nothing written


def test_plot_function_refuses_another_format(tmp_path):
    with pytest.raises(ValueError, match="a figure's name must end in"):
        plot_curves({"weight": CURVE}, tmp_path / "c.jpg")
    assert not list(tmp_path.iterdir())
