"""The `lmc-fast` command end to end on tiny settings: train, align, sweep, merge, plot, demo;
Hugging Face folders in and out; user errors exit with status 2 and one line on stderr."""
import json
import shutil
import struct
from pathlib import Path

import pytest
import torch

from lmc_fast.cli import main
from lmc_fast.io import load_model, save_model


TINY_VIT = ["--config", "d_model=16", "n_layer=1", "n_head=2", "d_mlp=32"]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def run(capsys, *argv):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def check_png(path, min_size=100):
    """A real PNG: signature, IHDR size, and matplotlib can decode it."""
    import matplotlib.image as mpimg

    data = Path(path).read_bytes()
    assert data[:8] == PNG_SIGNATURE
    width, height = struct.unpack(">II", data[16:24])
    assert width >= min_size and height >= min_size
    img = mpimg.imread(path)
    assert img.shape[:2] == (height, width) and img.std() > 0  # not a blank image


def check_error(rc, err, *needles):
    assert rc == 2
    lines = err.strip().splitlines()
    errors = [line for line in lines if line.startswith("lmc-fast: error: ")]
    assert len(errors) == 1 and lines[-1] == errors[0], err  # progress/log lines may precede it
    assert "Traceback" not in err
    for n in needles:
        assert n in errors[0], errors[0]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Three tiny ViTs on 128 digits images, 3 steps each."""
    root = tmp_path_factory.mktemp("cli")
    rc = main(["train", "--model", "vit", "--data", "digits", "--seeds", "0", "1", "2", "--out", str(root / "runs"),
               "--steps", "3", "--limit", "128", "--batch-size", "32", "-q", *TINY_VIT])
    assert rc == 0
    return root


def test_train_outputs(runs):
    summary = json.loads((runs / "runs" / "train.json").read_text())
    assert [r["seed"] for r in summary["runs"]] == [0, 1, 2]
    assert summary["config"]["d_model"] == 16
    for s in range(3):
        folder = runs / "runs" / f"seed{s}"
        assert (folder / "model.safetensors").is_file() and (folder / "config.json").is_file()
        m = load_model(folder)
        assert m.config.d_model == 16 and m.lmc_fast_metadata["data"] == "digits"
        assert m.lmc_fast_metadata["train"]["steps"] == 3
    w0, w1 = (load_model(runs / "runs" / f"seed{s}").head.weight for s in (0, 1))
    assert not torch.equal(w0, w1)  # different seeds, different models


def test_align_sweep_plot(runs, capsys, tmp_path):
    r = runs / "runs"
    rc, out, _ = run(capsys, "align", r / "seed0", r / "seed1", "--method", "weight", "--out", tmp_path / "w.safetensors", "-q")
    assert rc == 0 and "weight alignment" in out
    info = json.loads((tmp_path / "w.align.json").read_text())  # the summary never takes the sweep's w.json
    assert info["method"] == "weight" and info["space"] == "canonical" and info["seconds"] > 0
    rc, out, _ = run(capsys, "align", r / "seed0", r / "seed1", "--method", "activation", "--max-batches", "2",
                     "--out", tmp_path / "act.safetensors", "-q")  # data from the checkpoint's metadata
    assert rc == 0 and (tmp_path / "act.safetensors").is_file()
    rc, out, _ = run(capsys, "align", r / "seed0", r / "seed1", "--method", "activation", "--residual-only",
                     "--max-batches", "1", "--out", tmp_path / "res.safetensors", "-q")
    assert rc == 0 and json.loads((tmp_path / "res.align.json").read_text())["info"]["residual_only"] is True
    rc, _, err = run(capsys, "align", r / "seed0", r / "seed1", "--residual-only", "--out", tmp_path / "no.safetensors")
    check_error(rc, err, "--residual-only is an option of --method activation, not weight")
    rc, out, _ = run(capsys, "align", r / "seed0", r / "seed1", "--method", "learned", "--steps", "4", "--max-batches", "3",
                     "--target", "endpoints", "--augment", "mixup", "--lam", "uniform", "--out", tmp_path / "l.safetensors", "-q")
    learned = json.loads((tmp_path / "l.align.json").read_text())["info"]
    assert rc == 0 and learned["target"] == "endpoints" and learned["lam"] == "uniform" and "Mixup" in learned["augment"]
    rc, _, err = run(capsys, "align", r / "seed0", r / "seed1", "--method", "learned", "--steps", "2", "--max-batches", "3",
                     "--preset", "paper", "--augment", "mixup", "--out", tmp_path / "bad.safetensors", "-q")
    assert rc == 2 and "target='endpoints'" in err and not (tmp_path / "bad.safetensors").exists()

    rc, out, _ = run(capsys, "sweep", r / "seed0", r / "seed1", "--align", tmp_path / "w.safetensors", "--lambdas", "5",
                     "--out", tmp_path / "w_sweep.json", "--plot", tmp_path / "w_sweep.png", "-q")
    assert rc == 0 and "loss barrier" in out
    res = json.loads((tmp_path / "w_sweep.json").read_text())
    assert res["space"] == "canonical" and res["examples"] == 450
    curve = res["results"]["weight"]
    assert curve["lambdas"] == [0.0, 0.25, 0.5, 0.75, 1.0] and len(curve["loss"]) == 5
    assert curve["barrier"] == pytest.approx(max(curve["signed"]))
    check_png(tmp_path / "w_sweep.png")

    rc, _, _ = run(capsys, "sweep", r / "seed0", r / "seed1", "--align", tmp_path / "w.safetensors", "--lambdas",
                   "adaptive", "--out", tmp_path / "adaptive.json", "-q")
    adaptive = json.loads((tmp_path / "adaptive.json").read_text())["results"]["weight"]
    assert rc == 0 and adaptive["adaptive"]["evaluations"] == len(adaptive["lambdas"]) <= 25
    assert abs(adaptive["barrier"] - curve["barrier"]) < 0.05  # the 5-point curve above is coarse
    rc, _, err = run(capsys, "sweep", r / "seed0", r / "seed1", "--lambdas", "adaptive", "5", "--out",
                     tmp_path / "bad.json", "-q")
    check_error(rc, err, "stands alone")

    rc, _, _ = run(capsys, "sweep", r / "seed0", r / "seed1", "--lambdas", "0", "0.5", "1", "--max-batches", "1",
                   "--batch-size", "64", "--out", tmp_path / "raw.json", "-q")
    raw = json.loads((tmp_path / "raw.json").read_text())
    assert rc == 0 and raw["space"] == "raw" and raw["examples"] == 64
    assert raw["results"]["none"]["lambdas"] == [0.0, 0.5, 1.0]

    rc, out, _ = run(capsys, "plot", tmp_path / "raw.json", "--out", tmp_path / "raw.png")
    assert rc == 0
    check_png(tmp_path / "raw.png")
    rc, _, _ = run(capsys, "plot", tmp_path / "w_sweep.json")  # default name: the JSON's with .png
    assert rc == 0
    check_png(tmp_path / "w_sweep.png")


def test_merge_three(runs, capsys, tmp_path):
    r = runs / "runs"
    out_dir = tmp_path / "merged"
    rc, out, _ = run(capsys, "merge", r / "seed0", r / "seed1", r / "seed2", "--method", "weight", "--samples", "6",
                     "--rounds", "1", "--eval-batches", "1", "--out", out_dir, "-q")
    assert rc == 0 and "merged 3 models" in out
    res = json.loads((out_dir / "merge.json").read_text())
    assert res["mode"] == "mean" and res["space"] == "canonical" and res["rounds"] == 1
    assert len(res["simplex"]["samples"]) == 6 and res["simplex"]["worst"] is not None
    assert set(res["merged_eval"]) >= {"loss", "acc"}
    for i in range(3):
        load_model(out_dir / f"aligned_{i}")
        assert (out_dir / f"alignment_{i}.safetensors").is_file()
    merged = load_model(out_dir / "merged")
    assert merged.config.d_model == 16
    check_png(out_dir / "simplex.png")
    rc, _, _ = run(capsys, "plot", out_dir / "merge.json", "--out", tmp_path / "again.png")
    assert rc == 0
    check_png(tmp_path / "again.png")


# `make demo` installs no extras: the demo runs with transformers, triton, pytest, hypothesis unimportable
DEMO_WITHOUT_EXTRAS = """
import sys
for name in ("transformers", "triton", "pytest", "hypothesis"):
    sys.modules[name] = None  # import raises ImportError
from lmc_fast.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_demo_quick(tmp_path):
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-c", DEMO_WITHOUT_EXTRAS, "demo", "--quick", "--lambdas", "5", "--out",
                          str(tmp_path / "demo"), "-q"], capture_output=True, text=True, timeout=600)
    rc, out = res.returncode, res.stdout
    assert rc == 0, res.stderr
    assert "QUICK RUN" in out and "mean nothing" in out  # nobody mistakes these numbers for results
    res = json.loads((tmp_path / "demo" / "results.json").read_text())
    assert res["quick"] and "mean nothing" in res["note"]
    assert [row["method"] for row in res["table"]] == ["none", "permutation", "weight", "activation", "learned"]
    assert res["results"]["none"]["space"] == "raw" and res["results"]["weight"]["space"] == "canonical"
    for row in res["table"]:
        assert row["align_seconds"] >= 0 and 0 <= row["acc_mid"] <= 1
        assert row["method"] in out
    assert "loss barrier" in out and "acc @ 0.5" in out
    check_png(tmp_path / "demo" / "curves.png")
    load_model(tmp_path / "demo" / "models" / "seed1")
    assert (tmp_path / "demo" / "alignments" / "learned.safetensors").is_file()


def test_gpt2_text_and_hf_folders(capsys, tmp_path):
    """Train a tiny reference GPT-2 on a text file; merge three Hugging Face GPT-2 folders and
    get a save_pretrained folder back."""
    import transformers

    text = tmp_path / "t.txt"
    text.write_text("".join(f"line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(80)))
    rc, out, _ = run(capsys, "train", "--model", "gpt2", "--data", f"text:{text}", "--seeds", "0", "--steps", "2",
                     "--block-size", "16", "--out", tmp_path / "g", "-q", "--config", "n_layer=1", "n_embd=16", "n_head=2")
    assert rc == 0
    g = load_model(tmp_path / "g" / "seed0")
    assert g.lm_head.weight is g.tok_embed.weight and g.config.block_size == 16

    folders = []
    for s in range(3):
        torch.manual_seed(s)
        cfg = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=256, n_positions=16)
        folders.append(save_model(transformers.GPT2LMHeadModel(cfg), tmp_path / f"hf{s}"))
    rc, out, err = run(capsys, "merge", *folders, "--method", "weight", "--mode", "reference", "--data", f"text:{text}",
                       "--samples", "4", "--eval-batches", "1",
                       "--out", tmp_path / "hfm", "-q")
    assert rc == 0, err
    merged = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hfm" / "merged", local_files_only=True)
    assert merged.config.n_embd == 16
    check_png(tmp_path / "hfm" / "simplex.png")
    rc, out, _ = run(capsys, "sweep", folders[0], tmp_path / "hfm" / "aligned_1", "--data", f"text:{text}",
                     "--space", "canonical", "--lambdas", "3", "--out", tmp_path / "hs.json", "-q")
    assert rc == 0
    assert json.loads((tmp_path / "hs.json").read_text())["results"]["none"]["ppl"] is not None


def test_user_errors(runs, capsys, tmp_path):
    r = runs / "runs"
    # missing file
    rc, _, err = run(capsys, "align", tmp_path / "nope", r / "seed1", "--out", tmp_path / "x.safetensors")
    check_error(rc, err, "nope")
    # corrupt safetensors
    shutil.copytree(r / "seed1", tmp_path / "bad")
    (tmp_path / "bad" / "model.safetensors").write_bytes(b"garbage" * 10)
    rc, _, err = run(capsys, "sweep", r / "seed0", tmp_path / "bad", "--out", tmp_path / "x.json")
    check_error(rc, err, "model.safetensors")
    # mismatched models: a wider ViT
    from lmc_fast.models import ViT, ViTConfig

    save_model(ViT(ViTConfig.digits(d_model=24, n_layer=1, n_head=2, d_mlp=32)), tmp_path / "wide")
    rc, _, err = run(capsys, "align", r / "seed0", tmp_path / "wide", "--out", tmp_path / "x.safetensors")
    check_error(rc, err, "d_model")
    rc, _, err = run(capsys, "merge", r / "seed0", r / "seed1", tmp_path / "wide", "--out", tmp_path / "m")
    check_error(rc, err)
    assert not (tmp_path / "m").exists()
    # unsupported Hugging Face model
    (tmp_path / "bert").mkdir()
    (tmp_path / "bert" / "config.json").write_text(json.dumps({"model_type": "bert"}))
    rc, _, err = run(capsys, "sweep", tmp_path / "bert", r / "seed1", "--out", tmp_path / "x.json")
    check_error(rc, err, "bert")
    # data that does not fit / is not known
    rc, _, err = run(capsys, "sweep", r / "seed0", tmp_path / "wide", "--data", "nosuch", "--out", tmp_path / "x.json")
    check_error(rc, err)
    rc, _, err = run(capsys, "sweep", r / "seed0", r / "seed1", "--data", "text:/no/such.txt", "--out", tmp_path / "x.json")
    check_error(rc, err, "such.txt")
    # a result file that is not JSON, a bad alignment file
    (tmp_path / "junk.json").write_text("not json")
    rc, _, err = run(capsys, "plot", tmp_path / "junk.json")
    check_error(rc, err, "junk.json")
    (tmp_path / "al.safetensors").write_bytes(b"\x00" * 64)
    rc, _, err = run(capsys, "sweep", r / "seed0", r / "seed1", "--align", tmp_path / "al.safetensors", "--out", tmp_path / "x.json")
    check_error(rc, err, "al.safetensors")
    assert not (tmp_path / "x.json").exists() and not (tmp_path / "x.safetensors").exists()


def test_plane_two_and_three_models(runs, capsys, tmp_path):
    """`lmc-fast plane`: A, B and B aligned in one panel; A, B, C raw and aligned side by side."""
    r = runs / "runs"
    rc, out, _ = run(capsys, "plane", r / "seed0", r / "seed1", "--n", "3", "--max-batches", "1",
                     "--out", tmp_path / "p2.json", "--plot", tmp_path / "p2.png", "-q")
    assert rc == 0 and "lowest on the grid" in out
    res = json.loads((tmp_path / "p2.json").read_text())
    assert res["kind"] == "plane" and len(res["planes"]) == 1 and res["space"] == "canonical"
    (p,) = res["planes"].values()
    assert len(p["loss"]) == 3 and all(len(row) == 3 for row in p["loss"])
    check_png(tmp_path / "p2.png")
    rc, _, _ = run(capsys, "plane", r / "seed0", r / "seed1", r / "seed2", "--n", "3", "--max-batches", "1",
                   "--out", tmp_path / "p3.json", "--plot", tmp_path / "p3.png", "-q")
    res = json.loads((tmp_path / "p3.json").read_text())
    assert rc == 0 and list(res["planes"]) == ["raw", "aligned (weight)"]
    raw, aligned = res["planes"].values()
    # both planes hold model A at the origin with the same loss; the other models' losses are their own
    assert raw["models"][0]["loss"] == pytest.approx(aligned["models"][0]["loss"], rel=1e-9)
    for i in (1, 2):
        assert raw["models"][i]["loss"] == pytest.approx(aligned["models"][i]["loss"], rel=1e-5)
    check_png(tmp_path / "p3.png")
    rc, out, _ = run(capsys, "plot", tmp_path / "p3.json", "--out", tmp_path / "again.png", "-q")  # re-plotted
    assert rc == 0
    check_png(tmp_path / "again.png")
    for argv, needle in [(["--n", "1"], "--n must be in [2, 201]"), (["--margin", "nan"], "--margin must be")]:
        rc, _, err = run(capsys, "plane", r / "seed0", r / "seed1", *argv, "--out", tmp_path / "bad.json", "-q")
        check_error(rc, err, needle)
        assert not (tmp_path / "bad.json").exists()
    rc, _, err = run(capsys, "plane", r / "seed0", "--out", tmp_path / "bad.json", "-q")
    check_error(rc, err, "two or three models")
