"""File names for libraries that take only UTF-8 ones (safetensors): a path in a folder whose name
is other bytes (valid on Linux) is handed over as /proc/self/fd/N of the file opened here, or as a
temporary link with an ASCII name where /proc is absent."""
from __future__ import annotations

import contextlib
import os
import tempfile


def _is_utf8(name: str) -> bool:
    try:
        name.encode("utf-8")  # undecodable bytes became surrogate escapes, which do not encode
    except UnicodeEncodeError:
        return False
    return True


@contextlib.contextmanager
def utf8_name(path):
    """A UTF-8 name of the file `path` for the duration of the block (the path itself when it is one)."""
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


__all__ = ["utf8_name"]
