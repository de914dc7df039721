"""Task losses and evaluation metrics shared by training, matching and sweeps.

The task says how logits meet targets (`TASKS`, read off the model's Arch by `task_of`):
- "classify": logits (B, C), integer targets (B,);
- "next_token" (causal LMs): logits (B, T, V), targets = the input ids themselves; the shift
  happens here, as with Hugging Face `labels=`;
- "masked_token" (BERT): logits (B, T, V), targets (B, T) at the same positions: the original
  ids where the inputs were masked, -100 elsewhere (Hugging Face's masked-LM collator's labels);
- "denoise" (DiT): the predicted noise of every patch (B, N, C p p) against the noise drawn (B, C, H, W);
  the loss is the mean squared error per sample, and there is no accuracy (None; the batches' fixed draws
  of timestep and noise come from lmc_fast/diffusion.py).
A target of -100 (`IGNORE_INDEX`, Hugging Face's convention) marks a position to skip: it
counts in no loss, accuracy, calibration bin or example count. Callers that do not say the
task get it from the logits' rank: (B, C) classify, (B, T, V) next-token.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .checks import IGNORE_INDEX, check_batch, spec_from_model

ECE_BINS = 15


TASKS = ("classify", "next_token", "masked_token", "denoise")


def task_of(arch) -> str:
    """The model's task: classifiers pool, causal LMs predict the next token, bidirectional ones masked tokens,
    diffusion Transformers the noise."""
    if arch.conditioned:
        return "denoise"
    if arch.pooling == "cls":
        return "classify"
    return "next_token" if arch.causal else "masked_token"


def flat_logits_targets(logits: torch.Tensor, targets: torch.Tensor, task: str | None = None):
    """(N, C) logits and (N,) targets, shifting for next-token prediction."""
    if task is None:
        task = "next_token" if logits.dim() == 3 else "classify"
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    if task != "classify":
        if logits.dim() != 3 or targets.shape != logits.shape[:2]:
            what = "the input ids" if task == "next_token" else "the masked positions' ids (-100 elsewhere)"
            raise ValueError(f"LM targets must be {what} of shape {tuple(logits.shape[:2])}, got {tuple(targets.shape)}")
        if task == "masked_token":
            return logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)
        return logits[:, :-1].reshape(-1, logits.shape[-1]), targets[:, 1:].reshape(-1)
    if logits.dim() != 2 or targets.shape != logits.shape[:1]:
        raise ValueError(f"classification needs logits (B, C) and targets (B,), got {tuple(logits.shape)} and {tuple(targets.shape)}")
    return logits, targets


def noise_errors(pred: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """Per sample the mean squared error of a DiT's patch predictions (B, N, C p p) against the noise
    (B, C, H, W), brought to the predictions' layout."""
    from ..models.vit import patchify

    if pred.dim() != 3 or noise.dim() != 4 or pred.shape[0] != noise.shape[0] or not noise.is_floating_point():
        raise ValueError(f"denoising targets must be the noise (B, C, H, W) of predictions (B, N, C*p*p), got "
                         f"{tuple(noise.shape)} ({noise.dtype}) for {tuple(pred.shape)}")
    C = noise.shape[1]
    p = int(round((pred.shape[-1] / C) ** 0.5))
    if p * p * C != pred.shape[-1] or (noise.shape[2] // p) * (noise.shape[3] // p) != pred.shape[1]:
        raise ValueError(f"noise of shape {tuple(noise.shape)} does not fit predictions of shape {tuple(pred.shape)}")
    return (pred - patchify(noise, p).to(pred.dtype)).pow(2).mean(dim=(1, 2))


def task_loss(logits: torch.Tensor, targets: torch.Tensor, label_smoothing: float = 0.0,
              task: str | None = None) -> torch.Tensor:
    """Mean cross-entropy over the kept targets (-100 skipped); the mean squared error for "denoise". A batch
    with nothing kept gives a zero that still carries the graph (so backward runs) and moves nothing.
    The sum over the kept targets divided by their count (at least 1): the mean, without asking the
    device whether anything was kept (on CUDA that question is a host synchronisation per call)."""
    if task == "denoise":
        return noise_errors(logits.float(), targets).mean()
    lg, tg = flat_logits_targets(logits, targets, task)
    total = F.cross_entropy(lg.float(), tg, ignore_index=IGNORE_INDEX, label_smoothing=label_smoothing,
                            reduction="sum")
    return total / (tg != IGNORE_INDEX).sum().clamp_min(1)


def has_kept_targets(logits: torch.Tensor, targets: torch.Tensor, task: str | None = None) -> bool:
    """Whether any target (after the LM shift) is not the ignore index."""
    return bool((flat_logits_targets(logits, targets, task)[1] != IGNORE_INDEX).any())


def _sum_field(name: str):
    """A public sum of MetricSums: reading it first folds in what the device still holds."""

    def get(self):
        self.flush()
        return getattr(self, "_" + name)

    def set_(self, value):
        self.flush()
        setattr(self, "_" + name, value)

    return property(get, set_)


class MetricSums:
    """Accumulates loss / accuracy / calibration over batches (sums, so batch sizes may differ).

    `add` never waits for the device: each batch's sums (float64) stay on the logits' device until
    a field is read, then are folded into the public fields (host floats and float64 CPU tensors)
    batch by batch (`flush`): on CUDA a sweep synchronises once per mixture and read, not five
    times per mixture and batch, and the sums are the same whenever they are read."""

    FIELDS = ("is_lm", "task", "batches", "n", "loss", "correct", "bin_conf", "bin_acc", "bin_n")
    n, loss, correct = _sum_field("n"), _sum_field("loss"), _sum_field("correct")
    bin_conf, bin_acc, bin_n = _sum_field("bin_conf"), _sum_field("bin_acc"), _sum_field("bin_n")

    def __init__(self, is_lm: bool = False, task: str | None = None):
        self.is_lm, self.task = is_lm, task
        self.batches = 0
        self._pending = []  # per batch [loss, correct, n, bins (3 x ECE_BINS)] on the device, not yet folded in
        self._n, self._loss, self._correct = 0, 0.0, 0.0
        self._bin_conf, self._bin_acc, self._bin_n = (torch.zeros(ECE_BINS, dtype=torch.float64) for _ in range(3))

    def state(self) -> dict:
        """Every field, device sums folded in (what a record or an all-reduce carries)."""
        return {name: getattr(self, name) for name in self.FIELDS}

    def flush(self) -> None:
        """Fold the batches' sums still on the device into the fields: one copy to the host, then
        added batch after batch in order, so the result does not depend on when it is read."""
        pending, self._pending = self._pending, []
        if not pending:
            return
        for row in torch.stack(pending).cpu():
            self._loss += float(row[0])
            self._correct += float(row[1])
            self._n += int(row[2])
            bins = row[3:].reshape(3, ECE_BINS)
            self._bin_n, self._bin_acc, self._bin_conf = (self._bin_n + bins[0], self._bin_acc + bins[1],
                                                          self._bin_conf + bins[2])

    def _add_pending(self, loss, correct, n, bins) -> None:
        # detached: a sum kept until read must not keep the batch's autograd graph (and its activations) alive
        self._pending.append(torch.cat([torch.stack([loss, correct, n]), bins.reshape(-1)]).detach())

    def add(self, logits: torch.Tensor, targets: torch.Tensor):
        if self.task == "denoise":  # sums of per-sample squared errors; no accuracy or calibration
            self.batches += 1
            err = noise_errors(logits.double(), targets).sum()
            zero = err.new_zeros(())
            self._add_pending(err, zero, zero + targets.shape[0], err.new_zeros(3, ECE_BINS))
            return
        lg, tg = flat_logits_targets(logits, targets, self.task)
        self.batches += 1
        if tg.numel() == 0:
            return
        # ignored targets (-100) are masked, not dropped: dropping them would ask the device how many
        kept = tg != IGNORE_INDEX
        lg = lg.double()
        loss = F.cross_entropy(lg, tg, ignore_index=IGNORE_INDEX, reduction="sum")
        conf, pred = lg.softmax(-1).max(-1)
        keep = kept.double()
        hit = (pred == tg).double() * keep
        bins = torch.zeros(3, ECE_BINS, dtype=torch.float64, device=lg.device)
        idx = (conf * ECE_BINS).long().clamp_(max=ECE_BINS - 1)
        for row, values in enumerate((keep, hit, conf * keep)):
            bins[row].scatter_add_(0, idx, values)
        self._add_pending(loss, hit.sum(), keep.sum(), bins)

    def result(self) -> dict:
        if self.batches == 0:
            raise ValueError("no data: the evaluation iterable yielded no batches")
        if self.n == 0:
            raise ValueError(f"no data: every target of the {self.batches} batch(es) is the ignore index {IGNORE_INDEX}")
        loss = self.loss / self.n
        if self.task == "denoise":
            return {"loss": loss, "acc": None, "ece": None}
        ece = ((self.bin_conf - self.bin_acc).abs().sum() / self.n).item()
        # the reliability diagram of the ECE bins (JSON-ready): per bin the mean confidence and
        # accuracy (None for an empty bin) and the count of kept targets
        counts = [int(round(float(c))) for c in self.bin_n]
        reliability = {"conf": [float(s) / c if c else None for s, c in zip(self.bin_conf, counts)],
                       "acc": [float(s) / c if c else None for s, c in zip(self.bin_acc, counts)], "n": counts}
        out = {"loss": loss, "acc": self.correct / self.n, "ece": ece, "reliability": reliability}
        if self.is_lm:
            out["ppl"] = math.exp(min(loss, 700.0))
        return out


@torch.no_grad()
def evaluate(model, data, device=None, max_batches: int | None = None) -> dict:
    """Mean loss, accuracy, ECE (and perplexity for LMs) of any supported model over `data`."""
    from ..models.adapters import adapter_for

    adapter = adapter_for(model)
    task = task_of(adapter.arch(model))
    was_training = model.training
    model.eval()
    device = device or next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    spec = spec_from_model(model)
    sums = None
    for i, (x, y) in enumerate(data):
        if max_batches is not None and i >= max_batches:
            break
        check_batch(spec, x, y)
        x = x.to(device=device, dtype=dtype) if x.is_floating_point() else x.to(device)
        logits = adapter.logits(model, x)
        if sums is None:
            sums = MetricSums(is_lm=task != "classify", task=task)
        sums.add(logits, y.to(device))
    model.train(was_training)
    if sums is None:
        raise ValueError("no data: the evaluation iterable yielded no batches")
    return sums.result()
