"""`lmc-fast` on hostile input: every bad option, output path and result file exits with status 2
and one error line naming the option or file, never a traceback, and leaves every file as it was.

Also: the CLI's import is light (no torch) and sets OMP_WAIT_POLICY=passive for itself only,
merge writes only its own entries, and `--help` states every default."""
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lmc_fast.cli import build_parser, main
from lmc_fast.io import save_model
from lmc_fast.models import GPT2, GPT2Config, ViT, ViTConfig

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def ck(tmp_path_factory):
    """Tiny untrained checkpoints: three ViTs on digits, one GPT-2 (context 16) on a text file,
    a valid sweep result and an alignment of seed1 onto seed0."""
    root = tmp_path_factory.mktemp("ck")
    for s in range(3):
        torch.manual_seed(s)
        vit = ViT(ViTConfig.digits(d_model=16, n_layer=1, n_head=2, d_mlp=32))
        save_model(vit, root / f"seed{s}", metadata={"data": "digits"})
    text = root / "t.txt"
    text.write_text("the quick brown fox jumps over the lazy dog.\n" * 40)
    save_model(GPT2(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=256, block_size=16)), root / "gpt",
               metadata={"data": f"text:{text}"})
    curve = {"lambdas": [0.0, 0.5, 1.0], "loss": [1.0, 2.0, 1.0], "acc": [0.9, 0.5, 0.9], "barrier": 1.0}
    (root / "r.json").write_text(json.dumps({"kind": "sweep", "results": {"weight": curve}}))
    assert main(["align", str(root / "seed0"), str(root / "seed1"), "--out", str(root / "al.safetensors"), "-q"]) == 0
    return root


def snapshot(*roots) -> dict:
    """path -> content hash ('dir' for folders) of everything under `roots`."""
    out = {}
    for root in roots:
        for p in sorted(Path(root).rglob("*")):
            out[str(p)] = "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def run(capsys, argv):
    """main() in-process; argparse's usage errors (SystemExit) give their exit status too."""
    try:
        rc = main([str(a) for a in argv])
    except SystemExit as exc:
        rc = exc.code
    out, err = capsys.readouterr()
    return rc, out, err


def check_one_error(rc, err, needles):
    """Status 2, exactly one `lmc-fast...: error:` line (argparse's usage lines may precede it),
    naming every needle; no traceback."""
    assert rc == 2, err
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith("lmc-fast") and ": error: " in line]
    assert len(errors) == 1, err
    assert err.strip().splitlines()[-1] == errors[0], err
    for needle in needles:
        assert needle in errors[0], errors[0]


# ---------------------------------------------------------------- set-ups of the output cases
def keep_json(work):
    (work / "keep.json").write_text('{"keep": true}\n')
    (work / "some_directory.png").mkdir()


def align_summary_is_dir(work):
    (work / "x.safetensors").write_bytes(b"an earlier alignment")
    (work / "x.align.json").mkdir()


def plot_dir(work):
    (work / "plots").mkdir()


def parent_is_file(work):
    (work / "file.txt").write_text("a file, not a folder")


def user_folder(work):
    (work / "runs" / "seed0").mkdir(parents=True)
    (work / "runs" / "seed0" / "notes.txt").write_text("mine")


def deep_json(work):
    (work / "deep.json").write_text("[" * 100_000 + "]" * 100_000)


def not_a_result(work):
    (work / "hello.json").write_text('{"hello": 1}')
    (work / "bad_curve.json").write_text('{"results": {"w": {"lambdas": "abc", "loss": [1]}}}')
    (work / "list.json").write_text("[1, 2, 3]")


def merged_before(work):
    """A folder that looks like an earlier merge's output, used as the inputs of the next."""
    for i in range(2):
        torch.manual_seed(i)
        save_model(ViT(ViTConfig.digits(d_model=16, n_layer=1, n_head=2, d_mlp=32)), work / "m" / f"aligned_{i}",
                   metadata={"data": "digits"})


NO_SETUP = None
A, B, C, GPT = "{ck}/seed0", "{ck}/seed1", "{ck}/seed2", "{ck}/gpt"
SWEEP = ["sweep", A, B, "--out", "{work}/s.json"]
ALIGN = ["align", A, B, "--out", "{work}/a.safetensors"]
MERGE = ["merge", A, B, C, "--out", "{work}/m"]
TRAIN = ["train", "--data", "digits", "--out", "{work}/runs"]

# (id, argv, needles in the error line, set-up)
CASES = [
    # ---- counts and sizes
    ("batch-size-0", ALIGN + ["--method", "activation", "--batch-size", "0"], ["--batch-size", "'0'"], NO_SETUP),
    ("epochs-negative", TRAIN + ["--epochs", "-1"], ["--epochs", "'-1'"], NO_SETUP),
    ("steps-negative", TRAIN + ["--steps", "-5"], ["--steps", "'-5'"], NO_SETUP),
    ("align-steps-0", ALIGN + ["--method", "learned", "--steps", "0"], ["--steps", "'0'"], NO_SETUP),
    ("threads-negative", ALIGN + ["--threads", "-3"], ["--threads", "'-3'"], NO_SETUP),
    ("threads-0", ALIGN + ["--threads", "0"], ["--threads", "'0'"], NO_SETUP),
    ("samples-negative", MERGE + ["--samples", "-2"], ["--samples", "'-2'"], NO_SETUP),
    ("rounds-0", MERGE + ["--rounds", "0"], ["--rounds", "'0'"], NO_SETUP),
    ("max-batches-0", SWEEP + ["--max-batches", "0"], ["--max-batches", "'0'"], NO_SETUP),
    ("eval-batches-0", MERGE + ["--eval-batches", "0"], ["--eval-batches", "'0'"], NO_SETUP),
    ("max-tokens-0", SWEEP + ["--max-tokens", "0"], ["--max-tokens", "'0'"], NO_SETUP),
    ("limit-0", TRAIN + ["--limit", "0"], ["--limit", "'0'"], NO_SETUP),
    ("seeds-repeated", TRAIN + ["--seeds", "0", "0"], ["--seeds", "twice"], NO_SETUP),
    ("demo-lambdas-1", ["demo", "--quick", "--lambdas", "1", "--out", "{work}/d"], ["--lambdas", "'1'"], NO_SETUP),
    # ---- real numbers
    ("lr-nan", ALIGN + ["--lr", "nan"], ["--lr", "'nan'"], NO_SETUP),
    ("lr-0", ALIGN + ["--lr", "0"], ["--lr", "'0'"], NO_SETUP),
    ("lr-negative", TRAIN + ["--lr", "-1e-3"], ["--lr", "'-1e-3'"], NO_SETUP),
    ("temperature-0", ALIGN + ["--temperature", "0"], ["--temperature", "'0'"], NO_SETUP),
    ("alpha-negative", MERGE + ["--alpha", "-1"], ["--alpha", "'-1'"], NO_SETUP),
    ("alpha-0", MERGE + ["--alpha", "0"], ["--alpha", "'0'"], NO_SETUP),
    ("alpha-nan", MERGE + ["--alpha", "nan"], ["--alpha", "'nan'"], NO_SETUP),
    ("alpha-inf", MERGE + ["--alpha", "inf"], ["--alpha", "'inf'"], NO_SETUP),
    ("alpha-minus-inf", MERGE + ["--alpha", "-inf"], ["--alpha", "'-inf'"], NO_SETUP),
    ("lambdas-1e12", SWEEP + ["--lambdas", "1e12"], ["--lambdas", "1e12"], NO_SETUP),
    ("lambdas-nan", SWEEP + ["--lambdas", "nan"], ["--lambdas", "nan"], NO_SETUP),
    ("lambdas-count-1", SWEEP + ["--lambdas", "1"], ["--lambdas 1", "count"], NO_SETUP),
    ("lambdas-fraction", SWEEP + ["--lambdas", "0.5"], ["--lambdas 0.5", "count"], NO_SETUP),
    ("lambdas-out-of-range", SWEEP + ["--lambdas", "0", "0.5", "2"], ["--lambdas 2", "[0, 1]"], NO_SETUP),
    # ---- devices, blocks, configs
    ("device-foo", SWEEP + ["--device", "foo"], ["--device", "'foo'", "available: cpu"], NO_SETUP),
    ("device-cuda-index", SWEEP + ["--device", "cuda:99"], ["--device", "'cuda:99'", "available"], NO_SETUP),
    ("block-size-1", ["sweep", GPT, GPT, "--block-size", "1", "--out", "{work}/s.json"], ["--block-size", "'1'"], NO_SETUP),
    ("block-size-above-context", ["sweep", GPT, GPT, "--block-size", "4096", "--out", "{work}/s.json"],
     ["--block-size 4096", "context", "16"], NO_SETUP),
    ("merge-block-size-above-context", ["merge", GPT, GPT, "--block-size", "17", "--out", "{work}/m"],
     ["--block-size 17", "16"], NO_SETUP),
    ("config-unknown-key", TRAIN + ["--config", "foo=1"], ["--config foo=1", "'foo'"], NO_SETUP),
    ("config-negative", TRAIN + ["--config", "d_model=-3"], ["--config d_model=-3", "d_model"], NO_SETUP),
    ("config-float-for-int", TRAIN + ["--config", "n_layer=1.5"], ["--config n_layer=1.5", "n_layer"], NO_SETUP),
    ("config-heads-do-not-divide", TRAIN + ["--config", "d_model=16", "n_head=3"], ["--config", "n_head"], NO_SETUP),
    ("config-data-key", TRAIN + ["--config", "num_classes=3"], ["--config num_classes=3", "num_classes"], NO_SETUP),
    ("config-not-key-value", TRAIN + ["--config", "d_model"], ["--config", "'d_model'"], NO_SETUP),
    ("config-bad-norm", TRAIN + ["--config", "norm=batchnorm"], ["--config", "batchnorm"], NO_SETUP),
    # ---- output paths
    ("sweep-plot-into-directory", ["sweep", A, B, "--out", "{work}/keep.json", "--plot", "{work}/some_directory.png"],
     ["--plot", "some_directory.png", "folder"], keep_json),
    ("align-summary-is-directory", ["align", A, B, "--out", "{work}/x.safetensors"], ["x.align.json", "folder"],
     align_summary_is_dir),
    ("plot-into-directory", ["plot", "{ck}/r.json", "--out", "{work}/plots"], ["--out", "plots", "folder"], plot_dir),
    ("plot-out-is-input", ["plot", "{ck}/r.json", "--out", "{ck}/r.json"], ["--out", "r.json", "input"], NO_SETUP),
    ("sweep-out-is-alignment", SWEEP[:3] + ["--align", "{ck}/al.safetensors", "--out", "{ck}/al.safetensors"],
     ["--out", "al.safetensors", "input"], NO_SETUP),
    ("sweep-out-in-checkpoint", ["sweep", A, B, "--out", "{ck}/seed0/config.json"], ["config.json", "input"], NO_SETUP),
    ("sweep-out-equals-plot", SWEEP + ["--plot", "{work}/s.json"], ["--plot", "collides"], NO_SETUP),
    ("out-parent-is-file", ["sweep", A, B, "--out", "{work}/file.txt/s.json"], ["file.txt", "not a folder"],
     parent_is_file),
    ("merge-out-is-file", ["merge", A, B, "--out", "{work}/file.txt"], ["--out", "file.txt", "not a folder"],
     parent_is_file),
    ("merge-out-is-input", ["merge", A, B, "--out", A], ["--out", "seed0", "input"], NO_SETUP),
    ("merge-overwrites-input", ["merge", "{work}/m/aligned_0", "{work}/m/aligned_1", "--out", "{work}/m"],
     ["aligned_0", "input"], merged_before),
    ("train-over-user-folder", TRAIN + ["--steps", "1"], ["seed0", "not a model checkpoint"], user_folder),
    # ---- result files for plot
    ("plot-deep-json", ["plot", "{work}/deep.json", "--out", "{work}/p.png"], ["deep.json", "deeply"], deep_json),
    ("plot-not-a-result", ["plot", "{work}/hello.json", "--out", "{work}/p.png"], ["hello.json", "nothing to plot"],
     not_a_result),
    ("plot-bad-curve", ["plot", "{work}/bad_curve.json", "--out", "{work}/p.png"], ["bad_curve.json", "lambdas"],
     not_a_result),
    ("plot-json-list", ["plot", "{work}/list.json", "--out", "{work}/p.png"], ["list.json", "not a JSON result"],
     not_a_result),
    ("plot-several-without-out", ["plot", "{ck}/r.json", "{ck}/r.json"], ["--out", "several"], NO_SETUP),
    ("plot-overlay-not-curves", ["plot", "{ck}/r.json", "{work}/hello.json", "--out", "{work}/p.png"],
     ["hello.json", "overlay"], not_a_result),
]


@pytest.mark.parametrize("argv, needles, setup", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_hostile(ck, tmp_path, capsys, argv, needles, setup):
    work = tmp_path / "work"
    work.mkdir()
    if setup is not None:
        setup(work)
    before = snapshot(ck, work)
    rc, _, err = run(capsys, [a.format(ck=ck, work=work) for a in argv])
    check_one_error(rc, err, needles)
    assert snapshot(ck, work) == before  # nothing created, changed or removed


def test_enough_hostile_cases():
    assert len(CASES) >= 25


def test_merge_into_the_inputs_parent_keeps_everything(ck, tmp_path, capsys):
    """`merge victim/seed0 victim/seed1 --out victim` once replaced the whole folder; now it
    adds its own entries and leaves the inputs and an unrelated file byte-identical."""
    import shutil

    victim = tmp_path / "victim"
    for s in (0, 1):
        shutil.copytree(ck / f"seed{s}", victim / f"seed{s}")
    (victim / "NOTES.txt").write_text("my notes\n")
    before = snapshot(victim)
    rc, _, err = run(capsys, ["merge", victim / "seed0", victim / "seed1", "--out", victim, "--samples", "2",
                              "--rounds", "1", "--eval-batches", "1", "-q"])
    assert rc == 0, err
    after = snapshot(victim)
    assert {k: v for k, v in after.items() if k in before} == before
    new = sorted(Path(k).relative_to(victim).parts[0] for k in set(after) - set(before))
    assert set(new) == {"aligned_0", "aligned_1", "alignment_0.safetensors", "alignment_1.safetensors", "merged",
                        "merge.json"}


def test_failed_sweep_keeps_an_existing_result(ck, tmp_path, capsys):
    """The tester's case: a bad --plot once failed only after replacing keep.json."""
    keep_json(tmp_path)
    rc, _, err = run(capsys, ["sweep", ck / "seed0", ck / "seed1", "--out", tmp_path / "keep.json",
                              "--plot", tmp_path / "some_directory.png", "-q"])
    check_one_error(rc, err, ["--plot"])
    assert (tmp_path / "keep.json").read_text() == '{"keep": true}\n'


def test_alignment_for_other_models_needs_force(ck, tmp_path, capsys):
    from lmc_fast import Alignment

    al = Alignment.load(ck / "al.safetensors")
    if not hasattr(al, "verify_models") or al.info.get("fingerprint_a") is None:
        pytest.skip("alignment fingerprints not available in this checkout")
    argv = ["sweep", ck / "seed0", ck / "seed2", "--align", ck / "al.safetensors", "--lambdas", "3",
            "--max-batches", "1", "--out", tmp_path / "s.json", "-q"]
    rc, _, err = run(capsys, argv)
    check_one_error(rc, err, ["--force"])
    assert not (tmp_path / "s.json").exists()
    rc, _, err = run(capsys, argv + ["--force"])
    assert rc == 0, err


def test_plot_overlays_several_results(ck, tmp_path, capsys):
    # null: how strict JSON stores a NaN loss (a diverged point); it is drawn as a gap
    other = {"kind": "sweep", "results": {"none": {"lambdas": [0, 0.5, 1], "loss": [1.0, None, 1.0], "barrier": None}}}
    (tmp_path / "none.json").write_text(json.dumps(other))
    rc, out, err = run(capsys, ["plot", tmp_path / "none.json", ck / "r.json", ck / "r.json", "--out",
                                tmp_path / "both.png"])
    assert rc == 0, err
    assert (tmp_path / "both.png").read_bytes()[:4] == b"\x89PNG"


# ---------------------------------------------------------------- help
def _subparsers():
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, type(parser._subparsers._group_actions[0])))
    return action.choices


def test_help_states_every_default():
    for name, sub in _subparsers().items():
        formatter = sub._get_formatter()
        for action in sub._actions:
            if not action.option_strings or action.required or action.dest in ("help", "version"):
                continue
            assert "default" in formatter._get_help_string(action), f"{name} {action.option_strings}"


def test_help_names_the_reference_model():
    subs = _subparsers()
    for name in ("align", "sweep"):
        text = subs[name].format_help()
        assert "A: the reference model (lambda = 0)" in text and "B: the model aligned onto A" in " ".join(text.split())


# ---------------------------------------------------------------- threads and import weight
def _python(code: str, **env):
    full = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    full.update(env)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full, cwd=REPO, timeout=120)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


def test_cli_import_loads_no_torch():
    assert _python("import lmc_fast.cli, sys; print('torch' in sys.modules)") == "False"
    assert _python("import lmc_fast, sys; print('torch' in sys.modules)") == "False"


def test_cli_sets_passive_openmp_only_for_itself():
    code = "import os, lmc_fast.cli as c; c.prefer_passive_openmp(); print(os.environ.get('OMP_WAIT_POLICY'))"
    assert _python(code) == "passive"
    assert _python(code, OMP_WAIT_POLICY="active") == "active"  # the user's own setting wins
    library = "import os, lmc_fast as lf; lf.align; print(os.environ.get('OMP_WAIT_POLICY'))"
    assert _python(library) == "None"  # importing the library changes no thread setting


def test_console_script_usage_error_has_no_traceback(tmp_path):
    res = subprocess.run([sys.executable, "-m", "lmc_fast.cli", "sweep", "a", "b", "--lambdas", "1e12", "--out",
                          str(tmp_path / "x.json")], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.strip().splitlines()[-1].startswith("lmc-fast sweep: error: argument --lambdas")
    assert not (tmp_path / "x.json").exists()
