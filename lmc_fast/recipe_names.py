"""The recipes by name, torch-free: what the CLI's parsers and the grid spec read before torch loads.

A recipe is named MODEL-DATA (`lmc_fast.recipes` builds them; importing it loads torch). This table
and `lmc_fast.recipes.NAMES` are checked to agree (tests/test_methods_registry.py), so a new
recipe is added in both or a test fails.
"""
from __future__ import annotations

#: recipe name -> the --data spec it trains on
RECIPE_DATA = {"vit-digits": "digits", "vit-fashion-mnist": "fashion-mnist", "gpt2-shakespeare": "shakespeare",
               "llama-shakespeare": "shakespeare", "neox-shakespeare": "shakespeare", "bert-shakespeare": "shakespeare"}


def recipe_for(model: str, data: str) -> str | None:
    """The recipe that trains `model` on `data` (None: there is none)."""
    name = f"{model}-{data}"
    return name if RECIPE_DATA.get(name) == data else None


#: models with a recipe, and the data they have recipes for
RECIPE_MODELS = tuple(dict.fromkeys(name.split("-")[0] for name in RECIPE_DATA))
RECIPE_DATASETS = tuple(dict.fromkeys(RECIPE_DATA.values()))

__all__ = ["RECIPE_DATA", "RECIPE_DATASETS", "RECIPE_MODELS", "recipe_for"]
