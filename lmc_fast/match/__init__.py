"""Alignment algorithms: weight, permutation-only, activation and learned matching."""
from .align import METHODS, align
from .many import merge_many

__all__ = ["METHODS", "align", "merge_many"]
