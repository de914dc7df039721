"""Argument types, the help formatter and the option groups several commands share.

Each type raises argparse.ArgumentTypeError, so argparse prints its usage and one line
"lmc-fast CMD: error: argument --OPTION: <message naming the value>", exit status 2.
"""
from __future__ import annotations

import argparse
import math
import re

from .console import CLIError

from ..data_specs import DATA_HELP  # noqa: E402,F401  (torch-free)
MAX_LAMBDAS = 10_001  # as lmc_fast.sweep.barrier.MAX_LAMBDAS (not imported: that would load torch)


# ---------------------------------------------------------------- argument types
def _int_in(low: int, high: int | None, rule: str):
    def parse(text: str) -> int:
        try:
            value = int(text, 10)
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(f"{rule}, got {text!r}") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"{rule}, got {text!r}")
        return value

    return parse


positive_int = _int_in(1, None, "must be a positive integer")
nonnegative_int = _int_in(0, None, "must be an integer >= 0")
thread_count = _int_in(1, 1024, "must be an integer from 1 to 1024")
sample_count = _int_in(1, 100_000, "must be an integer from 1 to 100000")
lambda_count = _int_in(2, MAX_LAMBDAS, f"must be an integer from 2 to {MAX_LAMBDAS}")
block_size_arg = _int_in(2, None, "must be an integer >= 2 (tokens per block, at most the model's context)")


def _finite(text: str) -> float:
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def finite_positive_float(text: str) -> float:
    value = _finite(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number above 0, got {text!r}")
    return value


def lambda_value(text: str):
    """One --lambdas entry: a count (integer 2..MAX_LAMBDAS), a value in [0, 1] or "adaptive"."""
    if text.strip().lower() == "adaptive":
        return "adaptive"
    value = _finite(text)
    if 0.0 <= value <= 1.0 or (value.is_integer() and 2 <= value <= MAX_LAMBDAS):
        return value
    raise argparse.ArgumentTypeError(f"{text!r} is neither a count (an integer from 2 to {MAX_LAMBDAS}), "
                                     "a value in [0, 1] nor 'adaptive'")


def device_arg(text: str) -> str:
    """cpu, cuda, cuda:N or mps, only when this machine has it (the message lists what it has)."""
    name = text.strip().lower()
    if name == "cpu":
        return name  # the default: decided without importing torch
    cuda = re.fullmatch(r"cuda(?::(\d+))?", name)
    if cuda is None and name != "mps":
        raise argparse.ArgumentTypeError(f"unknown device {text!r}; available: {', '.join(available_devices())}")
    have = available_devices()
    if name not in have:
        raise argparse.ArgumentTypeError(f"{text!r} is not available on this machine; available: {', '.join(have)}")
    return name


def available_devices() -> list[str]:
    import torch

    have = ["cpu"]
    if torch.cuda.is_available():
        have += ["cuda"] + [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        have.append("mps")
    return have


def lambda_grid(values: list[float]):
    """--lambdas values -> a count (one value), the explicit list (several values in [0, 1]) or "adaptive"."""
    if "adaptive" in values:
        if len(values) > 1:
            raise CLIError("--lambdas adaptive stands alone (it chooses its own points)")
        return "adaptive"
    values = [float(v) for v in values]
    if len(values) == 1:
        value = values[0]
        if not (value.is_integer() and 2 <= value <= MAX_LAMBDAS):
            raise CLIError(f"--lambdas {value:g}: one value is a count of points, an integer from 2 to "
                           f"{MAX_LAMBDAS} (give several values in [0, 1] for an explicit grid)")
        return int(value)
    outside = [v for v in values if not 0.0 <= v <= 1.0]
    if outside:
        raise CLIError(f"--lambdas {outside[0]:g}: explicit values must lie in [0, 1]")
    return list(values)


# ---------------------------------------------------------------- parsers
class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's help states its default: appended unless the text already says it (the
    options whose default is "decided later" say so in their own words)."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "default" in text or not action.option_strings or action.required or action.default in (None, argparse.SUPPRESS):
            return text
        if isinstance(action.default, bool):
            shown = "on" if action.default else "off"
        elif isinstance(action.default, (list, tuple)):
            shown = " ".join(str(v) for v in action.default)
        else:
            shown = "%(default)s"
        return f"{text} (default: {shown})".strip()


#: what argparse should take as a negative number (a value) rather than an option: its own
#: pattern misses "-1e-3" and "-inf", which then read as "expected one argument" instead of
#: reaching the option's type check and its message naming the value
_NEGATIVE_NUMBER = re.compile(r"^-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$|^-(inf|infinity|nan)$", re.IGNORECASE)


def _accept_negative_numbers(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    if hasattr(parser, "_negative_number_matcher"):  # argparse internals, stable since Python 2.7
        parser._negative_number_matcher = _NEGATIVE_NUMBER
    return parser


def common_options() -> argparse.ArgumentParser:
    """The options every command but `plot` takes (its `parents`)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-q", "--quiet", action="store_true", help="no progress bars or log lines (results only)")
    common.add_argument("--device", type=device_arg, default="cpu", help="cpu, cuda, cuda:N or mps (when available)")
    common.add_argument("--seed", type=nonnegative_int, default=0, help="seed for matching / sampling")
    common.add_argument("--threads", type=thread_count, default=None,
                        help="torch CPU threads (default: torch's choice, 1 for the demo on CPU; "
                             "1 is often faster on a busy machine)")
    return common


def add_command(subparsers, name: str, help: str, parents) -> argparse.ArgumentParser:
    """A command's subparser: its help is also its description, every default is shown, and
    negative numbers reach the options' type checks."""
    return _accept_negative_numbers(subparsers.add_parser(name, parents=list(parents), help=help, description=help,
                                                          formatter_class=HelpFormatter))


def data_options(q, batch_help: str):
    """--data, --block-size, --batch-size, --max-batches of the commands that read data for models."""
    q.add_argument("--data", default=None, help=DATA_HELP + " (default: what the checkpoint was trained on)")
    q.add_argument("--block-size", type=block_size_arg, default=None,
                   help="tokens per block for text, at most the model's context "
                        "(default: the checkpoint's, else min(64, context))")
    q.add_argument("--batch-size", type=positive_int, default=None, help=batch_help)
    q.add_argument("--max-batches", type=positive_int, default=None, help="use at most N batches (default: all)")


def model_pair(q):
    """The positional models A and B of align and sweep."""
    q.add_argument("a", help="A: the reference model (lambda = 0)")
    q.add_argument("b", help="B: the model aligned onto A (lambda = 1)")
