"""lmc_fast: align, merge and measure independently trained Transformers."""
from . import models
from .models.adapters import UnsupportedModelError
from .symmetry import Alignment, to_canonical

__version__ = "0.1.0"
__all__ = ["Alignment", "UnsupportedModelError", "models", "to_canonical"]
