"""Interpolation, barriers, simplex sweeps and metrics."""
from .barrier import BarrierResult, barrier, lambda_grid
from .interpolate import interpolate
from .metrics import evaluate, task_loss
from .simplex import simplex

__all__ = ["BarrierResult", "barrier", "evaluate", "interpolate", "lambda_grid", "simplex", "task_loss"]
