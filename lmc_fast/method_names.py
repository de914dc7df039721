"""The matching methods by name, torch-free: what the CLI's parsers list before torch loads.

Importing `lmc_fast.match.methods` (the registry: how each method runs, where it sweeps)
imports the `lmc_fast.match` package and with it torch, which the `lmc-fast` command must not
load before setting OpenMP's environment. The registry and these tuples are checked to agree
(tests/test_methods_registry.py), so a new method is added in both or a test fails.
"""
from __future__ import annotations

#: every method, in the order tables and plots list them ("none": raw parameters, no alignment)
METHODS = ("none", "permutation", "weight", "activation", "learned")
#: the methods that read training batches (activation statistics, a loss)
DATA_METHODS = ("activation", "learned")
#: the names `lf.align` accepts (everything that produces an alignment)
ALIGN_METHODS = tuple(m for m in METHODS if m != "none")
#: cheap enough to run during training or for many pairs: no data
DATA_FREE_METHODS = tuple(m for m in METHODS if m not in DATA_METHODS)
DATA_FREE_ALIGN_METHODS = tuple(m for m in ALIGN_METHODS if m not in DATA_METHODS)

__all__ = ["ALIGN_METHODS", "DATA_FREE_ALIGN_METHODS", "DATA_FREE_METHODS", "DATA_METHODS", "METHODS"]
