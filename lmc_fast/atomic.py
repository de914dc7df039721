"""Writes that never lose data: atomic files and folders, strict JSON.

    with atomic_file("out/result.png") as tmp:   # write tmp; it replaces the target only on success
        figure.savefig(tmp)
    write_json("out/result.json", {"loss": float("nan")})   # {"loss": null}

- each file is written in a short hidden temporary folder beside its target
  (`.lmcf-<hash of the name>-<random>.tmp`), fsync'ed and renamed onto the target: one rename
  per file, then the folder is fsync'ed, so a crash leaves the old file or the new one;
- writers of one target take turns on an advisory lock (`fcntl.flock` on a hidden
  `.lmcf-<hash>.lock` beside it, removed again);
- temporary files are removed on errors and on SIGINT/SIGTERM (the signal is then delivered, so
  the program still stops); those a SIGKILL left are removed by the next write of the same
  target (ours by name, and not flock'ed by a live writer);
- files and folders get the usual modes under the umask (0644/0755 under umask 022);
- JSON is strict: NaN and infinities are written as null;
- several files that belong together (a checkpoint's, a command's outputs) are written inside
  `all_or_nothing()`: if the block fails (a full disk, no permission, a signal) every file it
  wrote is removed or gets its previous content back (kept meanwhile as a hidden hard link,
  `.lmcf-<hash>-<random>.keep`; one a SIGKILL left is removed by the next write of that target).

`lmc_fast.io` builds checkpoints on these; everything that writes a user's output uses them.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import secrets
import shutil
import signal
import stat
import threading
from pathlib import Path

from .errors import OutputError

try:
    import fcntl
except ImportError:  # not POSIX: writes stay atomic, concurrent writers are not serialised
    fcntl = None

TEMP_PREFIX = ".lmcf-"


# ---------------------------------------------------------------- JSON
def finite_json(obj):
    """`obj` with every NaN/±inf float replaced by None (JSON has no such numbers)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_json(v) for v in obj]
    return obj


def json_text(obj, **kw) -> str:
    """Strict JSON (indent 2 by default): non-finite floats become null, also those `default` returns."""
    kw.setdefault("indent", 2)
    kw.pop("allow_nan", None)
    default = kw.pop("default", None)
    if default is not None:
        kw["default"] = lambda o: finite_json(default(o))
    return json.dumps(finite_json(obj), allow_nan=False, **kw) + "\n"


def write_json(path, obj, **kw) -> Path:
    """JSON written atomically (indent 2 by default); NaN and infinities are written as null."""
    text = json_text(obj, **kw)
    with atomic_file(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


# ---------------------------------------------------------------- atomic writes
def _tag(name: str) -> str:
    """A short, fixed-length stand-in for a file name: temp and lock names stay legal for any legal name."""
    return hashlib.sha256(os.fsencode(name)).hexdigest()[:12]


def temp_prefix(name: str) -> str:
    return f"{TEMP_PREFIX}{_tag(name)}-"


def _lock_nowait(fd) -> bool:
    if fcntl is None:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError:
        return False


def _same_file(fd, path: Path) -> bool:
    try:
        a, b = os.fstat(fd), os.stat(path)
    except FileNotFoundError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _acquire(lock: Path) -> int:
    """An open fd holding an exclusive flock on `lock` (the file the previous holder removed is retried)."""
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except BaseException:
            _release_lock(fd, lock, only_if_free=True)
            raise
        if _same_file(fd, lock):
            return fd
        os.close(fd)


@contextlib.contextmanager
def _target_lock(path: Path):
    """Writers of `path` take turns: an exclusive flock on a hidden lock file beside it, removed afterwards
    (while still held, so a waiter that then locks the removed file notices and retries). Taking the lock
    is not interrupted by SIGINT/SIGTERM (they are delivered after the write), so no lock file is left."""
    if fcntl is None:
        yield
        return
    lock = path.parent / f"{TEMP_PREFIX}{_tag(path.name)}.lock"
    fd = None
    try:
        with signals_deferred():
            fd = _acquire(lock)
        yield
    finally:
        if fd is not None:
            _release_lock(fd, lock)


def _release_lock(fd, lock: Path, only_if_free: bool = False) -> None:
    """Remove the lock file (when `only_if_free`: only if nobody holds it) and close `fd`."""
    with signals_deferred():
        try:
            if (not only_if_free or _lock_nowait(fd)) and _same_file(fd, lock):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(lock)
        finally:
            os.close(fd)


def _remove_tree_or_file(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)


def remove_stale_temps(folder: Path, names) -> None:
    """Remove the temp files and folders that killed writers of `names` left in `folder`: only ours (by name)
    and only those no live writer holds (each temp is flock'ed while its writer lives)."""
    if fcntl is None:
        return
    prefixes = tuple(temp_prefix(n) for n in names)
    with contextlib.suppress(OSError), os.scandir(folder) as entries:
        found = [Path(e.path) for e in entries if e.name.startswith(prefixes)]
    stale = [p for p in found if p.name.endswith(".tmp")]
    # the previous files an all_or_nothing block of a killed process kept (this process's own are in use)
    mine = {e[2] for e in _journal or () if isinstance(e[2], Path)}
    for kept in found:
        if kept.name.endswith(".keep") and kept not in mine:
            with contextlib.suppress(OSError):
                os.remove(kept)
    for tmp in stale:
        try:
            fd = os.open(tmp, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except OSError:
            continue
        try:
            if _lock_nowait(fd):
                _remove_tree_or_file(tmp)
        finally:
            os.close(fd)


@contextlib.contextmanager
def temp_folder(path: Path):
    """Yields (a new private temp folder in `path`'s folder, the mode a new file gets under the umask).

    Every write goes through such a folder: whatever a writer leaves in it (safetensors, for one, writes
    its own `.tmpXXXXXX` and renames it) is removed with it. The folder is flock'ed while it lives, so a
    later writer can tell an abandoned one, and removed on leaving (its files have been renamed out)."""
    fd = None
    try:
        with signals_deferred():  # no signal between creating the folder and owning its clean-up
            tmp, fd = _new_temp_folder(path)
        _lock_nowait(fd)  # a fresh name: nobody else holds it
        # the umask, read without changing it (os.umask would, for every thread): 0o777 masked, minus x bits
        file_mode = stat.S_IMODE(os.fstat(fd).st_mode) & 0o666
        yield tmp, file_mode
    finally:
        if fd is not None:
            # a signal must not cut the removal short (that would leave half a temp folder behind):
            # it is recorded and delivered once the write is over
            with signals_deferred():
                try:
                    _remove_tree_or_file(tmp)  # still locked: no cleaner races us
                finally:
                    os.close(fd)


def _new_temp_folder(path: Path) -> tuple[Path, int]:
    """A fresh temp folder beside `path` and an open fd on it."""
    for _ in range(100):
        tmp = path.parent / f"{temp_prefix(path.name)}{secrets.token_hex(6)}.tmp"
        try:
            os.mkdir(tmp, 0o777)  # the umask applies: 0755 under 022
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(f"{path.parent}: cannot create a temporary folder")
    try:
        return tmp, os.open(tmp, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except BaseException:
        os.rmdir(tmp)
        raise


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError:  # some file systems cannot fsync a folder
        pass
    finally:
        os.close(fd)


def commit(tmp: Path, target: Path, mode: int | None = None) -> None:
    """Durable, atomic replace: the file gets `mode` (the umask's: writers such as safetensors make 0600
    files) and its data reaches the disk before the one rename that publishes it. Inside
    `all_or_nothing` the target's previous file is kept until the block ends (to be put back if it fails)."""
    if mode is not None and stat.S_IMODE(os.stat(tmp).st_mode) != mode:
        os.chmod(tmp, mode)
    fsync_path(tmp)
    entry = _journal_replace(target)
    try:
        os.replace(tmp, target)
    except BaseException:
        _forget(entry)
        raise
    fsync_path(target.parent)


def discard(path: Path) -> None:
    """Remove the file at `path` (a stale file of an earlier write); inside `all_or_nothing` it is only
    moved aside, and comes back if the block fails."""
    path = Path(path)
    if _journal is not None and not _noted(path) and os.path.lexists(path) and not \
            (os.path.isdir(path) and not os.path.islink(path)):
        kept = _keep_name(path)
        os.rename(path, kept)
        _journal.append(("file", path, kept))
        return
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)


def make_folders(path: Path) -> Path:
    """`path` made a folder with its missing parents (as mkdir(parents=True, exist_ok=True)); inside
    `all_or_nothing` those it makes are removed again, if left empty, when the block fails."""
    path = Path(path)
    missing = _missing_folders(path) if _journal is not None else []
    path.mkdir(parents=True, exist_ok=True)
    if _journal is not None:
        _journal.extend(("folder", f, None) for f in reversed(missing))
    return path


# ---------------------------------------------------------------- all or nothing
#: the open all_or_nothing block's record of what it changed, oldest first (None outside one):
#: ("file", target, kept) -- kept: the previous file moved aside, "new" (there was none) or None (it
#: could not be kept: the new file stays); ("folder", path, None) -- a folder it made
_journal: list | None = None


def _keep_name(target: Path) -> Path:
    return target.parent / f"{temp_prefix(target.name)}{secrets.token_hex(6)}.keep"


def _noted(target: Path) -> bool:
    return any(e[0] == "file" and e[1] == target for e in _journal)


def _journal_replace(target: Path):
    """Inside all_or_nothing: keep the file at `target` (a hard link, so no space is needed) before it is
    replaced, and note it; the journal entry, or None outside a block or when `target` was already
    noted (the first note holds what was there before the block)."""
    if _journal is None:
        return None
    target = Path(target)
    if _noted(target):
        return None
    if not os.path.lexists(target):
        kept = "new"
    elif os.path.isdir(target) and not os.path.islink(target):
        return None  # a folder: os.replace refuses it anyway
    else:
        kept = _keep_name(target)
        try:
            os.link(target, kept, follow_symlinks=False)
        except OSError:
            kept = None  # no hard links here: the new file stays if the block fails
    entry = ("file", target, kept)
    _journal.append(entry)
    return entry


def _forget(entry) -> None:
    """The replace `entry` was made for did not happen: drop it (and the kept link)."""
    if entry is None or _journal is None:
        return
    with contextlib.suppress(ValueError):
        _journal.remove(entry)
    if isinstance(entry[2], Path):
        with contextlib.suppress(OSError):
            os.remove(entry[2])


def _missing_folders(path: Path) -> list[Path]:
    """`path` and its ancestors that do not exist yet, deepest first."""
    out = []
    path = Path(path)
    while not os.path.lexists(path) and path != path.parent:
        out.append(path)
        path = path.parent
    return out


@contextlib.contextmanager
def all_or_nothing(*outputs):
    """Every file the block writes (through `commit`, `discard` and the writers built on them:
    write_json, atomic_file, save_model, Alignment.save) appears only if the whole block succeeds:
    if it raises (an OSError such as a full disk, a signal, anything), the files it created are
    removed, those it replaced or removed get their previous content back, and of `outputs` (the
    paths the block writes) and their folders those it created are removed again if left empty.
    The previous files are kept as hard links while the block runs, so a full disk cannot stop
    the undo. Blocks nest: an inner block is part of the outer one."""
    global _journal
    if _journal is not None:
        yield
        return
    made = [f for p in outputs for f in _missing_folders(Path(p))]
    # SIGINT/SIGTERM inside the block raise (the undo runs) and are delivered after it
    with _signal_guard(", ".join(map(str, outputs)) or "write"):
        _journal = journal = []
        try:
            yield
        except BaseException:
            with signals_deferred():
                _journal = None
                _undo(journal, made)
            raise
        else:
            with signals_deferred():
                _journal = None
                for _, _, kept in journal:
                    if isinstance(kept, Path):
                        with contextlib.suppress(OSError):
                            os.remove(kept)


def _undo(journal: list, made: list) -> None:
    touched = set()
    for kind, target, kept in reversed(journal):
        touched.add(target.parent)
        with contextlib.suppress(OSError):
            if kind == "folder":
                target.rmdir()  # only if empty: whatever else is there stays
            elif kept == "new":
                if os.path.lexists(target) and not (os.path.isdir(target) and not os.path.islink(target)):
                    os.remove(target)
            elif isinstance(kept, Path):
                os.replace(kept, target)
    for folder in sorted(set(made), key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):
            folder.rmdir()  # only if empty: whatever else is there stays
    for folder in touched:
        if folder.is_dir():
            fsync_path(folder)


@contextlib.contextmanager
def staged(target: Path, suffix: str = ""):
    """Yields (a path to write, `publish()` that renames it onto `target`); the caller holds the lock."""
    suffix = suffix or target.suffix
    with temp_folder(target) as (tmp, mode):
        # some writers pick the format from the extension; a short fixed name otherwise
        data = tmp / ("data" + (suffix if len(suffix) <= 16 else ""))
        yield data, lambda: commit(data, target, mode)


@contextlib.contextmanager
def _replacing(target: Path, suffix: str = ""):
    """Yields a path to write; when the block succeeds it replaces `target` (the caller holds the lock)."""
    with staged(target, suffix) as (data, publish):
        yield data
        with signals_deferred():
            publish()


class _Signalled(BaseException):
    """Raised inside a write when SIGINT/SIGTERM arrives, so that `finally` clauses remove temp files."""


_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_guarding = False
_deferring = False


@contextlib.contextmanager
def signals_deferred():
    """Renames that belong together run to the end: a SIGINT/SIGTERM meanwhile is only recorded, and
    delivered when the write is complete."""
    global _deferring
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    outer, _deferring = _deferring, True
    try:
        yield
    finally:
        _deferring = outer


@contextlib.contextmanager
def _signal_guard(what):
    """During the block SIGINT/SIGTERM raise _Signalled (temp files get removed on the way out); afterwards
    the previous handlers are back and the signal is delivered to them, so the program still stops."""
    global _guarding
    if _guarding or threading.current_thread() is not threading.main_thread():
        yield  # an outer guard is active, or handlers cannot be set from this thread
        return
    caught = []

    def on_signal(signum, frame):
        if caught:  # a second signal must not interrupt the cleanup
            return
        caught.append(signum)
        if not _deferring:
            raise _Signalled(signum)

    previous = {}
    for sig in _SIGNALS:
        old = signal.getsignal(sig)
        if old is not signal.SIG_IGN and old is not None:  # None: set from C, cannot be restored
            previous[sig] = signal.signal(sig, on_signal)
    _guarding, interrupted = True, False
    try:
        yield
    except _Signalled:
        interrupted = True
    finally:
        _guarding = False
        for sig, old in previous.items():
            signal.signal(sig, old)
    if caught:
        signal.raise_signal(caught[0])  # default SIGTERM: the process ends here; SIGINT: KeyboardInterrupt
        if interrupted:  # the program's own handler returned: say that nothing was written
            raise InterruptedError(f"{what}: write interrupted by {signal.Signals(caught[0]).name}")


def check_writable(path, what: str) -> None:
    """Before any work: `path` can be created (its nearest existing folder is one this process may
    write in); an OutputError naming `what` otherwise."""
    parent = Path(path).parent
    while not parent.exists():
        if parent.is_symlink():
            raise OutputError(f"{what} {path}: {parent} is a broken link")
        parent = parent.parent
    if not parent.is_dir():
        raise OutputError(f"{what} {path}: {parent} is not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError(f"{what} {path}: cannot write in {parent} (permission denied)")


#: how a writer written in Rust (safetensors) reports the OS error under it
_RUST_OS_ERROR = re.compile(r'Os \{ code: (\d+), kind: \w+, message: "([^"]*)" \}')


def os_error_of(exc: BaseException, path) -> OSError | None:
    """The OSError a writer's exception reports (errno, message, `path`), if it is one in disguise:
    safetensors' SafetensorError wraps "No space left on device" and the like; an OSError that names
    one of our temporary files (gone by then) is told of `path`, the file the user asked for."""
    if isinstance(exc, OSError):
        names = [n for n in (exc.filename, exc.filename2) if n is not None]
        if exc.errno is not None and any(TEMP_PREFIX in part for n in names for part in Path(os.fsdecode(n)).parts):
            return OSError(exc.errno, exc.strerror or str(exc), str(path))
        return None
    m = _RUST_OS_ERROR.search(str(exc))
    return OSError(int(m[1]), m[2], str(path)) if m else None


@contextlib.contextmanager
def writing(path: Path, *also):
    """The frame of every write of `path`: signals guarded, the target locked, stale temps of `path`
    (and of the sibling names in `also`) removed. An OS error a writer reports in its own type
    leaves as the OSError it is (the temp files are gone by then), so callers see one kind."""
    make_folders(path.parent)
    with _signal_guard(path), _target_lock(path):
        remove_stale_temps(path.parent, [path.name, *also])
        try:
            yield
        except Exception as exc:
            os_exc = os_error_of(exc, path)
            if os_exc is None:
                raise
            raise os_exc from exc


@contextlib.contextmanager
def atomic_file(path, suffix: str = ""):
    """Yields a temporary path next to `path`; renamed onto `path` (fsync'ed, one rename) only if the block
    succeeds. Writers of the same `path` take turns; the temp file is removed on errors and SIGINT/SIGTERM."""
    path = Path(path)
    with writing(path), _replacing(path, suffix) as tmp:
        yield tmp


@contextlib.contextmanager
def folder_for_write(path: Path):
    """`path` as a folder to write into (created if new: removed again, if still empty, when the write fails)."""
    if path.exists() and not path.is_dir():
        raise OutputError(f"{path} exists and is not a folder")
    created = not path.exists()
    make_folders(path)
    try:
        yield path
    except BaseException:
        if created:
            with contextlib.suppress(OSError):
                path.rmdir()  # only ever an empty folder we made
        raise


def _move_into(src: Path, dst: Path) -> None:
    """Every file under `src` renamed to the same place under `dst`, one rename each; other files of `dst` stay.
    Modes are the writers' (the block's files are its own)."""
    for root, _dirs, files in os.walk(src):
        rel = Path(root).relative_to(src)
        make_folders(dst / rel)
        for name in files:
            commit(Path(root) / name, dst / rel / name)


@contextlib.contextmanager
def atomic_dir(path, overwrite: bool = True):
    """Yields an empty temporary folder beside `path`; only if the block succeeds does its content appear:
    a new `path` is that folder, renamed; into an existing folder each file is renamed in, so files of
    `path` the block did not write are left alone. Nothing it did not create is ever deleted.
    With `overwrite=False` an existing `path` is an error."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise OutputError(f"{path} exists and is not a folder")
    if path.exists() and not overwrite:
        raise OutputError(f"{path} already exists")
    with writing(path), temp_folder(path) as (tmp, _mode):
        yield tmp
        with signals_deferred():
            if not _rename_new_folder(tmp, path):
                _move_into(tmp, path)
        fsync_path(path.parent)


def _rename_new_folder(tmp: Path, path: Path) -> bool:
    if path.exists() or _journal is not None:  # inside all_or_nothing: file by file, so each can be undone
        return False
    for root, _dirs, files in os.walk(tmp):
        for name in files:
            fsync_path(Path(root) / name)
    try:
        os.rename(tmp, path)
    except OSError:  # someone made `path` meanwhile: merge into it instead
        return False
    return True



__all__ = ["all_or_nothing", "atomic_dir", "atomic_file", "check_writable", "discard", "finite_json", "json_text",
           "make_folders", "write_json"]
