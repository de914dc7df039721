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
damaged file, sums of another layout, or sums no MetricSums could hold: `BlockCheckpoint._check`
validates every field) is discarded with a warning and the block recomputed: a record is never
trusted for inputs it was not made from, nor half-used. A file at a record's name that no sweep
wrote (not a JSON object with the record's format and key) is refused in one line, never replaced.
"""
from __future__ import annotations

import hashlib
import json
import math
import warnings
from pathlib import Path

import torch

from ..atomic import write_json
from .metrics import TASKS, MetricSums

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
    if isinstance(value, (bool, int, str)) or value is None:
        return value
    raise TypeError(f"cannot record a {type(value).__name__} of the metric sums")


def _decode_float(value) -> float:
    if not (isinstance(value, dict) and set(value) == {"hex"} and isinstance(value["hex"], str)):
        raise ValueError(f"a float must be recorded as {{'hex': ...}}, got {value!r:.60}")
    return float.fromhex(value["hex"])


def _decode_like(name: str, value, like):
    """`value` decoded to the type (and for a tensor the dtype and shape) of the field's fresh value `like`
    (None: an optional text field)."""
    if like is None or isinstance(like, str):
        if value is not None and not isinstance(value, str):
            raise ValueError(f"{name} must be text or null, got {value!r:.60}")
        return value
    if isinstance(like, bool):
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be a bool, got {value!r:.60}")
        return value
    if isinstance(like, int):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{name} must be an int, got {value!r:.60}")
        return value
    if isinstance(like, float):
        return _decode_float(value)
    if isinstance(like, torch.Tensor):
        dtype = str(like.dtype).replace("torch.", "")
        if not (isinstance(value, dict) and set(value) == {"dtype", "shape", "values"} and value["dtype"] == dtype
                and value["shape"] == list(like.shape) and isinstance(value["values"], list)
                and len(value["values"]) == like.numel()):
            raise ValueError(f"{name} must be a {dtype} tensor of shape {list(like.shape)}")
        return torch.tensor([_decode_float(v) for v in value["values"]], dtype=like.dtype).reshape(like.shape)
    raise TypeError(f"no record format for a {type(like).__name__}")  # a MetricSums field this code cannot read


def check_sums(s: MetricSums) -> None:
    """A ValueError unless the sums could come from MetricSums.add: counts >= 0, a known task of the
    sums' kind (language model or classifier), finite sums,
    loss >= 0, every bin's count whole, its accuracy and confidence sums within [0, count]
    (confidence within the bin's range), bin counts summing to n and their hits to `correct`."""
    if s.batches < 0 or s.n < 0 or s.n > 0 and s.batches == 0:
        raise ValueError(f"counts out of range (batches {s.batches}, n {s.n})")
    if s.task is not None and (s.task not in TASKS or (s.task == "classify") == s.is_lm):
        raise ValueError(f"task {s.task!r:.60} is not one of {', '.join(TASKS)} fitting is_lm={s.is_lm}")
    if not (math.isfinite(s.loss) and s.loss >= 0):
        raise ValueError(f"loss sum {s.loss!r} is not a finite number >= 0")
    if not (math.isfinite(s.correct) and 0 <= s.correct <= s.n and s.correct == round(s.correct)):
        raise ValueError(f"correct {s.correct!r} is not a whole number in [0, n={s.n}]")
    if s.n == 0 and s.loss != 0:
        raise ValueError("a loss sum without targets")
    bins = torch.stack([s.bin_n, s.bin_acc, s.bin_conf])
    if not bool(torch.isfinite(bins).all()) or bool((bins < 0).any()):
        raise ValueError("calibration bins not finite and >= 0")
    if not bool((s.bin_n == s.bin_n.round()).all()) or float(s.bin_n.sum()) != s.n:
        raise ValueError(f"calibration bin counts are not whole numbers summing to n={s.n}")
    if not bool((s.bin_acc == s.bin_acc.round()).all()) or float(s.bin_acc.sum()) != s.correct \
            or bool((s.bin_acc > s.bin_n).any()):
        raise ValueError("calibration bin hits do not fit their counts and `correct`")
    j = torch.arange(len(s.bin_n), dtype=torch.float64)
    slack = 1e-9 * (1 + s.bin_n)  # float sums of the confidences
    if bool((s.bin_conf < j / len(j) * s.bin_n - slack).any() or (s.bin_conf > (j + 1) / len(j) * s.bin_n + slack).any()):
        raise ValueError("calibration bin confidences outside their bins")


def sums_state(s: MetricSums | None):
    """Every field of the sums (whatever MetricSums holds), floats exactly; None stays None."""
    return None if s is None else {name: _encode(v) for name, v in s.state().items()}


def sums_from_state(state) -> MetricSums | None:
    """The sums back, checked in full (types, dtypes, shapes, `check_sums`); a ValueError for a
    state that is not one this version's MetricSums could have written."""
    if state is None:
        return None
    if not isinstance(state, dict):
        raise ValueError(f"the record's metric sums must be an object, got {type(state).__name__}")
    s = MetricSums(is_lm=state.get("is_lm") is True)
    if set(state) != set(s.FIELDS):
        raise ValueError("the record's metric sums have other fields than this version's")
    for name, value in state.items():
        setattr(s, name, _decode_like(name, value, getattr(s, name)))  # every field is a settable attribute
    check_sums(s)
    return s


def check_block_sums(sums: list) -> None:
    """The mixtures of one block saw the same batches: the same kind, batch and target counts."""
    kinds = {(s.is_lm, s.batches, s.n) for s in sums if s is not None}
    if len(kinds) > 1 or (kinds and None in sums):
        raise ValueError("the mixtures' sums count different data")


# ---------------------------------------------------------------- one block's record
class StaleRecord(Exception):
    """The record does not fit the data being read: it is discarded and the block recomputed."""


class BlockCheckpoint:
    """The record of mixtures `idx` (their sums live in `sums[idx]`), read when it exists.

    The engine calls `take(x, y)` on every batch it reads (False: the record covers it, skip it),
    `evaluated()` after each batch it evaluates and `finish()` at the block's end; `take` and
    `finish` raise StaleRecord, before anything is evaluated, when the data contradict the record."""

    def __init__(self, folder, key: str, every: int, sums: list, idx: list[int], is_lm: bool | None = None):
        self.path = Path(folder) / f"{key}.json"
        self.key, self.every, self.sums, self.idx, self.is_lm = key, every, sums, idx, is_lm
        self.data = DataHash()
        self.record = self._read()

    def _read(self) -> dict | None:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            warnings.warn(f"{self.path}: unreadable sweep record ({exc}); recomputing the block", stacklevel=4)
            return None
        try:
            parsed = json.loads(raw.decode("utf-8"))
        except ValueError:  # not UTF-8, or not JSON
            parsed = None
        if not (isinstance(parsed, dict) and "format" in parsed and "key" in parsed):
            # not something a sweep writes: a file of the user's that happens to carry a record's name
            raise ValueError(f"{self.path}: not a sweep record (this sweep would overwrite it); move it away "
                             "or choose another checkpoint folder")
        try:
            record = self._check(parsed)
        except (ValueError, TypeError, KeyError, AttributeError, RuntimeError, OverflowError) as exc:
            warnings.warn(f"{self.path}: not a record of this block ({exc}); recomputing the block", stacklevel=4)
            return None
        return record

    def _check(self, record) -> dict:
        """The record, validated in full against what `_write` writes (a ValueError otherwise)."""
        if not isinstance(record, dict) or set(record) != {"format", "key", "batches", "data", "done", "sums"}:
            raise ValueError("other fields than a sweep record's")
        if record["format"] != RESUME_FORMAT or record["key"] != self.key:
            raise ValueError("another format or block")
        batches, data, done, sums = record["batches"], record["data"], record["done"], record["sums"]
        if isinstance(batches, bool) or not isinstance(batches, int) or batches < 1:
            raise ValueError(f"batches {batches!r} is not an int >= 1")
        if not isinstance(data, str) or not isinstance(done, bool):
            raise ValueError("data hash or done flag of the wrong type")
        if not isinstance(sums, list) or len(sums) != len(self.idx):
            raise ValueError(f"sums for {len(self.idx)} mixtures expected")
        record["sums"] = [sums_from_state(s) for s in sums]
        check_block_sums(record["sums"])
        # each batch read adds to every mixture's sums at least once
        if any(s is None or s.batches < batches for s in record["sums"]):
            raise ValueError(f"sums over fewer than the record's {batches} batches")
        if self.is_lm is not None and record["sums"][0].is_lm != self.is_lm:
            raise ValueError("sums of another kind of model (language model or classifier)")
        return record

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


__all__ = ["BlockCheckpoint", "DataHash", "StaleRecord", "block_key", "check_block_sums", "check_every", "check_sums", "params_fingerprint",
           "run_block", "sums_from_state", "sums_state"]
