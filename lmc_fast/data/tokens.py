"""The tokenisers of text datasets: UTF-8 bytes (vocab 256) or a character vocabulary."""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import torch


def char_vocab(text: str) -> list[str]:
    """Sorted distinct characters of `text` (the char tokenizer's vocabulary)."""
    return sorted(set(text))


def encode(text: str, tokenizer: str = "byte", chars: Optional[Sequence[str]] = None) -> torch.Tensor:
    """Token ids (int64) of `text`: UTF-8 bytes (vocab 256) or indices into `chars`."""
    if tokenizer == "byte":
        return torch.frombuffer(bytearray(text.encode("utf-8")), dtype=torch.uint8).long()
    if tokenizer == "char":
        if chars is None:
            raise ValueError("the char tokenizer needs its vocabulary (chars)")
        if not chars:
            raise ValueError("empty char vocabulary")
        codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
        vocab = np.array([ord(c) for c in chars], dtype=np.uint32)
        order = np.argsort(vocab, kind="stable")
        pos = np.minimum(np.searchsorted(vocab[order], codes), len(vocab) - 1)
        unknown = vocab[order][pos] != codes
        if unknown.any():
            bad = chr(int(codes[np.argmax(unknown)]))
            raise ValueError(f"character {bad!r} is not in the vocabulary")
        return torch.from_numpy(order[pos].astype(np.int64))
    raise ValueError(f"tokenizer must be 'byte' or 'char', got {tokenizer!r}")


def decode(ids, tokenizer: str = "byte", chars: Optional[Sequence[str]] = None) -> str:
    ids = torch.as_tensor(ids).reshape(-1).tolist()
    if tokenizer == "byte":
        return bytes(ids).decode("utf-8", errors="replace")
    if tokenizer == "char":
        if chars is None:
            raise ValueError("the char tokenizer needs its vocabulary (chars)")
        return "".join(chars[i] for i in ids)
    raise ValueError(f"tokenizer must be 'byte' or 'char', got {tokenizer!r}")
