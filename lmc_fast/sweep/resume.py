"""Resume inside a sweep: each block of mixtures records its metric sums as it goes.

Inside a sweep a unit of work is (block of mixtures, data shard). With `EvalOptions.checkpoint`
(a folder) the batched engine writes, per block, one small JSON file after every
`checkpoint_every` of this rank's batches and at the block's end: the sums so far (floats as
`float.hex`, so read back bit for bit), how many batches they cover, and a running hash of those
batches' bytes in the order they were read. The file is named by a hash of everything else that
determines the sums (`block_key`: the parameters, the block's weights, dtype, device kind, pass
sizes, max_batches, shard, input spec).

A re-run with the same folder reads the recorded prefix of the data (hashing it, evaluating
nothing) and trusts the record only if the hash of what it read matches; a finished block is
read back the same way. A record that does not match (other data, fewer or more batches, a
damaged file, sums of another layout) is discarded with a warning and the block recomputed: a
record is never trusted for inputs it was not made from.
"""
from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path

import torch

from ..atomic import write_json
from .metrics import MetricSums

#: bump when a record would no longer hold what this code computes
RESUME_FORMAT = 1


# ---------------------------------------------------------------- hashes
def _tensor_bytes(t: torch.Tensor):
    """The raw bytes of a tensor (any dtype, any device), as a buffer for a hash."""
    t = t.detach().to("cpu").contiguous().reshape(-1)
    return t.view(torch.uint8).numpy()


def _update(h, t: torch.Tensor) -> None:
    h.update(f"{t.dtype}{tuple(t.shape)};".encode())  # equal bytes of another shape are other data
    h.update(_tensor_bytes(t))


def params_fingerprint(params_list) -> str:
    """A hash of the N models' parameters (names, dtypes, shapes and bytes), in model order."""
    h = hashlib.blake2b(digest_size=16)
    for n, params in enumerate(params_list):
        for name in sorted(params):
            h.update(f"{n}:{name}:".encode())
            _update(h, params[name])
    return h.hexdigest()


def block_key(fingerprint: str, weights: torch.Tensor, **setting) -> str:
    """The name of a block's record: the parameters' fingerprint, the block's float64 weights
    (exactly, as hex) and the engine's `setting` (dtype, device kind, pass sizes, shard, ...)."""
    rows = [[float(v).hex() for v in row] for row in torch.as_tensor(weights, dtype=torch.float64).tolist()]
    text = json.dumps({"format": RESUME_FORMAT, "params": fingerprint, "weights": rows,
                       **{k: str(v) for k, v in setting.items()}}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


class DataHash:
    """A running hash of the batches as they are read (data order matters), and their count."""

    def __init__(self):
        self._h = hashlib.blake2b(digest_size=16)
        self.count = 0

    def update(self, x: torch.Tensor, y: torch.Tensor) -> None:
        _update(self._h, x)
        _update(self._h, y)
        self.count += 1

    def hexdigest(self) -> str:
        return self._h.hexdigest()


# ---------------------------------------------------------------- MetricSums <-> JSON, exactly
def _encode(value):
    if isinstance(value, torch.Tensor):
        return {"dtype": str(value.dtype).replace("torch.", ""), "shape": list(value.shape),
                "values": [_encode(v) for v in value.reshape(-1).tolist()]}
    if isinstance(value, float):
        return {"hex": value.hex()}
    if isinstance(value, (bool, int)) or value is None:
        return value
    raise TypeError(f"cannot record a {type(value).__name__} of the metric sums")


def _decode(value):
    if isinstance(value, dict) and "hex" in value:
        return float.fromhex(value["hex"])
    if isinstance(value, dict):
        flat = [_decode(v) for v in value["values"]]
        return torch.tensor(flat, dtype=getattr(torch, value["dtype"])).reshape(value["shape"])
    return value


def sums_state(s: MetricSums | None):
    """Every field of the sums (whatever MetricSums holds), floats exactly; None stays None."""
    return None if s is None else {name: _encode(v) for name, v in vars(s).items()}


def sums_from_state(state) -> MetricSums | None:
    """The sums back; a ValueError when the state's fields are not those MetricSums has now."""
    if state is None:
        return None
    s = MetricSums(is_lm=bool(state.get("is_lm")))
    if set(state) != set(vars(s)):
        raise ValueError("the record's metric sums have other fields than this version's")
    for name, value in state.items():
        setattr(s, name, _decode(value))
    return s


# ---------------------------------------------------------------- one block's record
class StaleRecord(Exception):
    """The record does not fit the data being read: it is discarded and the block recomputed."""


class BlockCheckpoint:
    """The record of mixtures `idx` (their sums live in `sums[idx]`), read when it exists.

    The engine calls `take(x, y)` on every batch it reads (False: the record covers it, skip it),
    `evaluated()` after each batch it evaluates and `finish()` at the block's end; `take` and
    `finish` raise StaleRecord, before anything is evaluated, when the data contradict the record."""

    def __init__(self, folder, key: str, every: int, sums: list, idx: list[int]):
        self.path = Path(folder) / f"{key}.json"
        self.key, self.every, self.sums, self.idx = key, every, sums, idx
        self.data = DataHash()
        self.record = self._read()

    def _read(self) -> dict | None:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except OSError as exc:
            warnings.warn(f"{self.path}: unreadable sweep record ({exc}); recomputing the block", stacklevel=4)
            return None
        try:
            record = json.loads(text)
            ok = (record.get("format") == RESUME_FORMAT and record.get("key") == self.key
                  and isinstance(record.get("batches"), int) and record["batches"] >= 1
                  and isinstance(record.get("data"), str) and len(record.get("sums", ())) == len(self.idx))
            if ok:
                record["sums"] = [sums_from_state(s) for s in record["sums"]]
                return record
        except (ValueError, TypeError, KeyError, AttributeError, RuntimeError):
            pass
        warnings.warn(f"{self.path}: not a record of this block; recomputing the block", stacklevel=4)
        return None

    @property
    def resumed(self) -> int:
        """Batches the record covers (0 without one)."""
        return self.record["batches"] if self.record else 0

    def take(self, x: torch.Tensor, y: torch.Tensor) -> bool:
        """Hash the batch just read; True when it is to be evaluated."""
        self.data.update(x, y)
        if self.record is None:
            return True
        n, covered = self.data.count, self.record["batches"]
        if n < covered:
            return False
        if n == covered:  # the whole recorded prefix is read: it must be the data the record saw
            if self.data.hexdigest() != self.record["data"]:
                raise StaleRecord(f"the first {covered} batches differ from those the record was made from")
            for i, s in zip(self.idx, self.record["sums"]):
                self.sums[i] = s
            return False
        if self.record["done"]:
            raise StaleRecord(f"the data have more than the {covered} batches of the finished record")
        return True

    def evaluated(self) -> None:
        if self.data.count % self.every == 0:
            self._write(done=False)

    def finish(self) -> None:
        if self.record is not None and self.data.count < self.record["batches"]:
            raise StaleRecord(f"the data have fewer than the record's {self.record['batches']} batches")
        if self.data.count and not (self.record and self.record["done"]):
            self._write(done=True)

    def discard(self) -> None:
        """Forget the record (and the file) and what it put in `sums`; the block starts afresh."""
        self.path.unlink(missing_ok=True)
        self.record, self.data = None, DataHash()
        for i in self.idx:
            self.sums[i] = None

    def _write(self, done: bool) -> None:
        write_json(self.path, {"format": RESUME_FORMAT, "key": self.key, "batches": self.data.count,
                               "data": self.data.hexdigest(), "done": done,
                               "sums": [sums_state(self.sums[i]) for i in self.idx]}, indent=None)


def run_block(evaluate, checkpoint: BlockCheckpoint | None) -> None:
    """evaluate(checkpoint); once more from scratch when the record proves stale (with a warning)."""
    if checkpoint is None:
        evaluate(None)
        return
    try:
        evaluate(checkpoint)
    except StaleRecord as exc:
        warnings.warn(f"{checkpoint.path}: {exc}; discarding the record and recomputing the block", stacklevel=3)
        checkpoint.discard()
        evaluate(checkpoint)


def check_every(every) -> int:
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ValueError(f"checkpoint_every must be an int >= 1 (batches), got {every!r}")
    return every


__all__ = ["BlockCheckpoint", "DataHash", "StaleRecord", "block_key", "check_every", "params_fingerprint",
           "run_block", "sums_from_state", "sums_state"]
