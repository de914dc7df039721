"""Output paths: every path a command will write, checked before any work starts."""
from __future__ import annotations

import os
from pathlib import Path

from .console import CLIError


class Outputs:
    """Every path a command will write, checked before any work starts, so that a bad one
    costs nothing and clobbers nothing. Files are replaced atomically; folders (model
    checkpoints) are replaced whole by `lmc_fast.io.save_model`, so an existing one must be a
    checkpoint (or empty). Inputs are never written: no output may be an input, a file of an
    input folder, or a folder holding an input."""

    def __init__(self, inputs=()):
        self.inputs: list[Path] = []
        self.files: list[tuple[str, Path]] = []
        self.folders: list[tuple[str, Path]] = []
        self.figures: list[tuple[str, Path]] = []
        self.intos: list[Path] = []
        for path in inputs:
            self.add_input(path)

    def add_input(self, path):
        if path is None:
            return
        path = Path(path)
        self.inputs.append(path)
        if path.suffix == ".safetensors":
            self.inputs.append(path.with_suffix(".json"))  # a lone checkpoint file's config

    def file(self, label: str, path) -> Path:
        self.files.append((label, Path(path)))
        return Path(path)

    def figure(self, label: str, path) -> Path:
        """A figure file: `file`, whose suffix must also name a format the plots write
        (plots.figure_format; checked by `check`, after the paths)."""
        self.figures.append((label, Path(path)))
        return self.file(label, path)

    def folder(self, label: str, path) -> Path:
        self.folders.append((label, Path(path)))
        return Path(path)

    def into(self, label: str, path) -> Path:
        """A folder the command writes entries into (train, merge, demo --out): it must be a
        folder or creatable, and must not be an input or inside one; other files in it stay."""
        path = Path(path)
        if path.exists() and not path.is_dir():
            raise CLIError(f"{label} {path}: exists and is not a folder")
        _check_parent(f"{label} {path}", path)
        real = path.resolve()
        for src in self.inputs:
            src_real = src.resolve()
            if real == src_real or src_real in real.parents:
                how = "is the input" if real == src_real else "is inside the input"
                raise CLIError(f"{label} {path}: {how} {src}; choose another output folder")
        self.intos.append(path)
        return path

    def all_or_nothing(self):
        """A block writing the command's outputs as one: if any write fails (a full disk, no permission,
        Ctrl-C), none is left, and the files they replaced are back (`lmc_fast.atomic.all_or_nothing`)."""
        from ..atomic import all_or_nothing

        return all_or_nothing(*self.intos, *(p for _, p in self.folders), *(p for _, p in self.files))

    def check(self):
        seen: list[tuple[str, Path, bool]] = []
        for label, path, is_folder in [(l, p, False) for l, p in self.files] + [(l, p, True) for l, p in self.folders]:
            where = f"{label} {path}"
            _check_parent(where, path)
            if is_folder:
                _check_replaceable_folder(where, path)
            elif path.is_dir():
                raise CLIError(f"{where}: is a folder; give a file name")
            real = path.resolve()
            for src in self.inputs:
                _check_not_input(where, real, is_folder, src)
            for other_label, other, other_folder in seen:
                if real == other or (other_folder and other in real.parents) or (is_folder and real in other.parents):
                    raise CLIError(f"{where}: collides with {other_label}")
            seen.append((f"{label} {path}", real, is_folder))
        from ..plots import figure_format

        for label, path in self.figures:
            try:
                figure_format(path)
            except ValueError as exc:
                raise CLIError(f"{label} {exc}") from None
        for label, path in self.files:
            if path.is_file() and not written_by_us(path):
                raise CLIError(f"{label} {path}: exists and was not written by lmc-fast; not overwriting it "
                               f"(remove it or choose another path)")


_FIGURE_MAGIC = (b"\x89PNG\r\n\x1a\n", b"%PDF-", b"<?xml")


def written_by_us(path: Path) -> bool:
    """Whether the file at `path` is one lmc-fast writes (so a command may replace it): a JSON result
    (an object with a "kind"), a safetensors file with lmc_fast metadata, or a figure (PNG, PDF, SVG)."""
    import json

    try:
        with open(path, "rb") as f:
            head = f.read(8)
            if head.startswith(_FIGURE_MAGIC) or head[:5] in _FIGURE_MAGIC:
                return True
            if head.lstrip()[:1] == b"{":
                f.seek(0)
                obj = json.loads(f.read().decode("utf-8"))
                return isinstance(obj, dict) and isinstance(obj.get("kind"), str)
    except (OSError, ValueError):
        return False
    return _lmc_fast_safetensors(path)


def _lmc_fast_safetensors(path: Path) -> bool:
    try:
        from safetensors import safe_open

        from ..paths import utf8_name

        with utf8_name(path) as name, safe_open(name, framework="pt") as f:
            meta = f.metadata() or {}
    except Exception:  # noqa: BLE001 - not a safetensors file (or not readable): not ours
        return False
    return "lmc_fast" in meta or str(meta.get("format", "")).startswith("lmc_fast")


def _check_parent(where: str, path: Path):
    """The nearest existing ancestor must be a writable folder (missing folders get created)."""
    parent = path.parent
    while not parent.exists():
        if parent.is_symlink():  # a dangling link: mkdir would fail later
            raise CLIError(f"{where}: {parent} is a broken link")
        parent = parent.parent
    if not parent.is_dir():
        raise CLIError(f"{where}: {parent} is not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise CLIError(f"{where}: cannot write in {parent} (permission denied)")


def _check_replaceable_folder(where: str, path: Path):
    if not path.exists():
        return
    if not path.is_dir():
        raise CLIError(f"{where}: exists and is not a folder")
    is_checkpoint = (path / "config.json").is_file()
    if not is_checkpoint and any(path.iterdir()):
        raise CLIError(f"{where}: exists and is not a model checkpoint; not replacing it (choose another --out)")


def _check_not_input(where: str, real: Path, is_folder: bool, src: Path):
    src_real = src.resolve()
    if real == src_real:
        raise CLIError(f"{where}: is also an input ({src}); choose another output")
    if src_real in real.parents and real.exists():
        raise CLIError(f"{where}: would overwrite part of the input {src}")
    if is_folder and real in src_real.parents:
        raise CLIError(f"{where}: would replace the input {src} inside it")


def now() -> str:
    """The time stamp of a result JSON ("date")."""
    import datetime

    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")
