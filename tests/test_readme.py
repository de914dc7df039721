"""The README's examples work as written: its Python blocks run (on tiny untrained checkpoints
at the paths they load), and its command-line sequence parses and never overwrites one
command's output with another's."""
import re
import shlex
from pathlib import Path

import torch

from lmc_fast.cli import align_summary_path, build_parser
from lmc_fast.io import save_model
from lmc_fast.models import ViT, ViTConfig

README = Path(__file__).resolve().parents[1] / "README.md"


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)


def test_python_blocks_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for s in range(3):  # what `make demo` + `lmc-fast train --seeds 2` would leave, tiny and untrained
        torch.manual_seed(s)
        save_model(ViT(ViTConfig.digits(d_model=16, n_layer=1, n_head=2, d_mlp=32)), f"demo_out/models/seed{s}",
                   metadata={"data": "digits"})
    code = blocks("python")
    assert len(code) == 5
    namespace = {}
    for block in code:
        # as written, except far fewer optimisation steps (the test checks that it runs, not how well)
        exec(compile(re.sub(r"steps=\d+", "steps=3", block), "README.md", "exec"), namespace)
    assert (tmp_path / "merged" / "model.safetensors").is_file()
    assert namespace["res"].barrier == namespace["res"].barrier  # a number, not NaN
    assert namespace["dit_res"].barrier == namespace["dit_res"].barrier and namespace["dit_res"].acc_barrier is None


def readme_commands() -> list[list[str]]:
    """The `lmc-fast ...` lines of the README's command-line block, without the synopsis lines
    (optional [..] parts, a|b alternatives)."""
    block = next(b for b in blocks("bash") if "lmc-fast align" in b)
    lines = block.replace("\\\n", " ").splitlines()
    out = []
    for line in lines:
        words = shlex.split(line, comments=True)
        if words[:1] == ["lmc-fast"] and not any(c in line for c in "[|"):
            out.append(words[1:])
    return out


def outputs_of(args) -> list[Path]:
    if args.command == "align":
        return [Path(args.out), align_summary_path(args.out)]
    if args.command == "sweep":
        return [Path(args.out)] + ([Path(args.plot)] if args.plot else [])
    return [Path(args.out)]


def test_command_sequence_parses_and_never_clobbers():
    parser = build_parser()
    written = {}
    commands = readme_commands()
    assert {c[0] for c in commands} >= {"align", "sweep", "merge", "plot"}
    for argv in commands:
        args = parser.parse_args(argv)
        for path in outputs_of(args):
            assert path not in written, f"`lmc-fast {' '.join(argv)}` overwrites {path} from `{written[path]}`"
            written[path] = " ".join(argv)
