"""File names for libraries that take only UTF-8 ones (safetensors): a path in a folder whose name
is other bytes (valid on Linux) is handed over as /proc/self/fd/N of the file opened here, or as a
temporary link with an ASCII name where /proc is absent; and for streams that print only their
encoding (stdout under a UTF-8 locale): such a name is printed with its bytes escaped."""
from __future__ import annotations

import contextlib
import os
import sys
import tempfile


def _is_utf8(name: str) -> bool:
    try:
        name.encode("utf-8")  # undecodable bytes became surrogate escapes, which do not encode
    except UnicodeEncodeError:
        return False
    return True


@contextlib.contextmanager
def utf8_name(path):
    """A UTF-8 name of the file (or folder) `path` for the duration of the block (the path itself when it
    is one)."""
    name = os.fspath(path)
    if _is_utf8(name):
        yield name
        return
    fd = os.open(name, os.O_RDONLY)
    try:
        proc = f"/proc/self/fd/{fd}"
        if os.path.exists(proc):
            yield proc
            return
        with tempfile.TemporaryDirectory() as tmp:
            link = os.path.join(tmp, "file" + os.path.splitext(os.fsencode(name))[1].decode("ascii", "replace"))
            os.symlink(os.path.abspath(name), link)
            yield link
    finally:
        os.close(fd)


def printable(text: str, stream=None) -> str:
    """`text` as `stream` (default stdout) can write it: a file name's undecodable bytes (surrogate
    escapes, which a strict UTF-8 stdout refuses with UnicodeEncodeError) shown as \\xNN."""
    encoding = getattr(stream if stream is not None else sys.stdout, "encoding", None) or "utf-8"
    try:
        text.encode(encoding)
        return text
    except UnicodeEncodeError:
        pass
    try:
        return text.encode(encoding, "surrogateescape").decode(encoding, "backslashreplace")
    except UnicodeError:
        return text.encode(encoding, "backslashreplace").decode(encoding)


def print_line(text: str, stream=None) -> None:
    """print(text, flush=True) to `stream` (default stdout), of any file name (see `printable`)."""
    stream = stream if stream is not None else sys.stdout
    print(printable(text, stream), file=stream, flush=True)


__all__ = ["print_line", "printable", "utf8_name"]
