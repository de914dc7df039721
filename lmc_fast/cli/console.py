"""What a command says: results on stdout, progress on stderr, and the user errors it raises."""
from __future__ import annotations

import sys

from ..paths import print_line

PROG = "lmc-fast"


class CLIError(Exception):
    """A user error: printed as one line, exit status 2."""


class Console:
    def __init__(self, quiet: bool):
        self.quiet = quiet

    def log(self, msg: str):
        if not self.quiet:
            print_line(msg, sys.stderr)

    def out(self, msg: str):
        print_line(msg)  # a path whose name is not UTF-8 is printed escaped, not refused by a strict stdout


def one_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    if isinstance(exc, KeyError) and text.startswith(("'", '"')):
        text = text[1:-1]
    return " ".join(text.split())
