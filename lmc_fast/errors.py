"""The errors a user can fix: each is one line naming the file, field or value at fault, and
the CLI prints it as `lmc-fast: error: ...` with exit status 2."""
from __future__ import annotations


class OutputError(ValueError):
    """An output cannot be written where asked (a file where a folder must go, an existing target)."""


class CheckpointError(ValueError):
    """A checkpoint is missing, corrupt, or does not fit its model; the message names the file/parameter."""


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """The checkpoint path does not exist."""


__all__ = ["CheckpointError", "CheckpointNotFoundError", "OutputError"]
