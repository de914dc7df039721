"""A Hugging Face Trainer callback that logs the barrier to a reference while training.

    from lmc_fast.callbacks import BarrierCallback
    trainer = Trainer(model, args, train_dataset=...,
                      callbacks=[BarrierCallback("runs/gpt2-seed0", test_batches, every=100, method="weight")])

Every `every` optimiser steps it measures (`lmc_fast.monitor.BarrierMonitor`: same weights
afterwards, bit for bit) and puts `lmc/barrier`, `lmc/acc_barrier`, `lmc/loss_mid` and
`lmc/seconds` into the Trainer's logs at that step, so the console, `state.log_history` and
every logger in `report_to` (TensorBoard, W&B, ...) get them. Only the main process measures.

transformers is imported here, not by `import lmc_fast`: this module is the only one that needs it.
"""
from __future__ import annotations

import sys

from .monitor import BarrierMonitor

try:
    from transformers import TrainerCallback
    from transformers.trainer_callback import CallbackHandler
except ImportError:  # transformers missing: the class below refuses to be built, with the fix
    TrainerCallback, CallbackHandler = object, None


class BarrierCallback(TrainerCallback):
    """`BarrierMonitor` as a TrainerCallback; the arguments are the monitor's (see there).
    `monitor` exposes the monitor itself (its `history` holds every measurement)."""

    def __init__(self, reference, data, every: int = 100, lambdas=5, method: str = "none",
                 max_batches: int | None = None, prefix: str = "lmc/", jsonl=None, **monitor_kw):
        if CallbackHandler is None:
            raise ImportError("BarrierCallback needs transformers: pip install 'lmc-fast[hf]'")
        self.monitor = BarrierMonitor(reference, data, every=every, lambdas=lambdas, method=method,
                                      max_batches=max_batches, prefix=prefix, jsonl=jsonl, **monitor_kw)
        self._pending: dict | None = None

    def _go_first(self) -> None:
        """Move this callback to the front of the Trainer's list. The Trainer appends user callbacks
        after the reporting ones (TensorBoard, W&B...), which would log each step before this
        callback adds its numbers; no hook hands callbacks the list, so it is found as the caller:
        every event reaches a callback from `CallbackHandler.call_event`."""
        handler = sys._getframe(2).f_locals.get("self")  # _go_first <- on_* <- call_event
        if isinstance(handler, CallbackHandler) and self in handler.callbacks and handler.callbacks[0] is not self:
            handler.callbacks.remove(self)
            handler.callbacks.insert(0, self)

    def on_init_end(self, args, state, control, **kwargs):
        self._go_first()

    def on_train_begin(self, args, state, control, **kwargs):
        self._go_first()  # also when added with trainer.add_callback after the Trainer was built

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if model is None or not state.is_world_process_zero:
            return control
        if self.monitor.step(model, state.global_step) is not None:
            self._pending = dict(self.monitor.last_metrics)
            control.should_log = True  # the Trainer logs this step, and on_log below adds the numbers
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self._pending is None or logs is None:
            return control
        logs.update(self._pending)
        # the Trainer appended its copy of `logs` to the history just before calling on_log
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1].update(self._pending)
        self._pending = None
        return control


__all__ = ["BarrierCallback"]
