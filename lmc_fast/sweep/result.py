"""`BarrierResult`, the lambda grid and the result of a sweep's metric rows: what every sweep engine returns
(the fused and per-point engines of barrier.py, the layer-streamed one of streamed.py, the monitor)."""
from __future__ import annotations

import json
import numbers
from dataclasses import asdict, dataclass, field

from .checks import as_real


@dataclass
class BarrierResult:
    lambdas: list[float]
    loss: list[float]
    acc: list[float]
    ece: list[float]
    ppl: list[float] | None
    loss_a: float
    loss_b: float
    acc_a: float
    acc_b: float
    barrier: float  # loss barrier (max of loss - chord, clipped at 0 only by being a max over ends)
    acc_barrier: float  # max accuracy drop below the chord
    signed: list[float] = field(default_factory=list)  # loss - chord at every lambda
    signed_min: float = 0.0
    signed_max: float = 0.0
    space: str = "canonical"
    engine: str = "loop"
    seconds: float = 0.0
    # per lambda the reliability diagram of the ECE bins: {"conf", "acc", "n"} (15 bins each;
    # conf/acc None for an empty bin); None for results made before it was recorded
    reliability: list[dict] | None = None
    # lambdas="adaptive": evaluations, rounds, peak_resolved, tol (None for a fixed grid)
    adaptive: dict | None = None
    # checkpoint paths swept a layer at a time (sweep/streamed.py): bytes_read, tokens, lambdas; else None
    streamed: dict | None = None

    @property
    def loss_barrier(self) -> float:
        return self.barrier

    def at(self, lam: float) -> dict:
        i = min(range(len(self.lambdas)), key=lambda j: abs(self.lambdas[j] - lam))
        return {"lambda": self.lambdas[i], "loss": self.loss[i], "acc": self.acc[i]}

    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self, **kw) -> str:
        return json.dumps(self.to_dict(), **kw)


#: Most points one path may have: far more than any plot resolves, and a count past it is a
#: typo (`--lambdas 1e12` once built a trillion-entry list until the kernel killed it).
MAX_LAMBDAS = 10_001


def lambda_grid(lambdas) -> list[float]:
    """A count (int in [2, MAX_LAMBDAS]: evenly spaced, both ends included) or explicit
    values (finite, in [0, 1], at most MAX_LAMBDAS of them) -> the list of lambdas."""
    if isinstance(lambdas, numbers.Integral) and not isinstance(lambdas, bool):
        count = int(lambdas)
        if not 2 <= count <= MAX_LAMBDAS:
            raise ValueError(f"lambdas as a count must be an int in [2, {MAX_LAMBDAS}] (both ends included), got {count}")
        return [i / (count - 1) for i in range(count)]
    if isinstance(lambdas, (str, bytes, bool, numbers.Number)) or not hasattr(lambdas, "__len__"):
        raise ValueError(f"lambdas must be a count (an int >= 2), a list of values in [0, 1] or 'adaptive', "
                         f"got {lambdas!r}")
    if not 1 <= len(lambdas) <= MAX_LAMBDAS:
        raise ValueError(f"lambdas must list between 1 and {MAX_LAMBDAS} values, got {len(lambdas)}")
    grid = []
    for value in lambdas:
        lam = as_real(value)
        if not 0.0 <= lam <= 1.0:  # also false for NaN
            raise ValueError(f"lambdas must be finite values in [0, 1], got {value!r}")
        grid.append(lam)
    return grid


def barrier_result(lams: list[float], by_lam: dict, space: str, engine: str, seconds: float) -> BarrierResult:
    """The BarrierResult of the metrics rows `by_lam` (lambda -> metrics dict, holding 0 and 1)
    over the grid `lams`; shared with `lmc_fast.monitor`, which evaluates parameters directly."""
    ra, rb = by_lam[0.0], by_lam[1.0]
    rows = [by_lam[l] for l in lams]
    chord = [(1 - l) * ra["loss"] + l * rb["loss"] for l in lams]
    signed = [r["loss"] - c for r, c in zip(rows, chord)]
    # no accuracy (None) for tasks without one (DiT's denoising)
    acc_drop = (None if ra["acc"] is None else
                [(1 - l) * ra["acc"] + l * rb["acc"] - r["acc"] for l, r in zip(lams, rows)])
    return BarrierResult(
        lambdas=lams, loss=[r["loss"] for r in rows], acc=[r["acc"] for r in rows], ece=[r["ece"] for r in rows],
        ppl=[r["ppl"] for r in rows] if "ppl" in ra else None,
        loss_a=ra["loss"], loss_b=rb["loss"], acc_a=ra["acc"], acc_b=rb["acc"],
        barrier=max(signed), acc_barrier=None if acc_drop is None else max(acc_drop), signed=signed, signed_min=min(signed),
        signed_max=max(signed), space=space, engine=engine, seconds=seconds,
        reliability=[r["reliability"] for r in rows] if all("reliability" in r for r in rows) else None,
    )
