"""Interpolation, barriers, simplex and plane sweeps, and metrics."""
from .barrier import BarrierResult, barrier, lambda_grid
from .interpolate import interpolate
from .metrics import evaluate, task_loss
from .plane import plane
from .simplex import simplex

__all__ = ["BarrierResult", "barrier", "evaluate", "interpolate", "lambda_grid", "plane", "simplex", "task_loss"]
