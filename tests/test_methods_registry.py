"""One list of methods: the torch-free names (what the CLI parsers offer) agree with the registry."""
import subprocess
import sys

from lmc_fast import method_names as names
from lmc_fast.match import methods


def test_torch_free_names_agree_with_the_registry():
    assert names.METHODS == methods.METHODS
    assert names.ALIGN_METHODS == methods.ALIGN_METHODS
    assert names.DATA_METHODS == tuple(m.name for m in methods.REGISTRY.values() if m.needs_data)
    assert names.DATA_FREE_METHODS == tuple(m.name for m in methods.REGISTRY.values() if not m.needs_data)


SCRIPT = """
import json, sys
from lmc_fast.cli import build_parser
commands = next(a for a in build_parser()._actions if a.dest == "command" or hasattr(a, "choices") and "align" in (a.choices or {}))
def choices(cmd, dest):
    return sorted(next(a for a in commands.choices[cmd]._actions if a.dest == dest).choices)
print(json.dumps([choices("align", "method"), choices("merge", "method"), choices("instability", "methods"),
                  "torch" in sys.modules]))
"""


def test_cli_method_choices_come_from_the_registry_without_torch():
    import json

    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True).stdout
    align, merge, instability, torch_loaded = json.loads(out)
    assert align == merge == sorted(methods.ALIGN_METHODS)
    assert instability == sorted(m.name for m in methods.REGISTRY.values() if not m.needs_data)
    assert not torch_loaded


def test_one_model_registry():
    """`adapter_for`, io.py's checkpoint classes and the CLI's `train --model` read one registry."""
    import lmc_fast.io as io
    from lmc_fast.cli.train import MODEL_TYPES
    from lmc_fast.models.adapters import HUGGING_FACE, REFERENCE, adapter_for

    assert tuple(REFERENCE) == MODEL_TYPES
    assert io._CLASSES == {t: (m, c) for t, (m, c, _) in REFERENCE.items()}
    assert io._HF_CLASSES == {t: names for t, (names, _) in HUGGING_FACE.items()}
    for _, (model_cls, config_cls, adapter) in REFERENCE.items():
        assert type(adapter_for(model_cls(config_cls()))) is adapter


def test_recipe_names_agree_with_the_recipes():
    """The torch-free recipe table (CLI parsers, grid specs) names exactly the recipes there are, and each
    recipe's model is a model `train` builds."""
    from lmc_fast.cli.train import MODEL_TYPES
    from lmc_fast.recipe_names import RECIPE_DATA, RECIPE_MODELS, recipe_for
    from lmc_fast.recipes import NAMES

    assert tuple(RECIPE_DATA) == NAMES
    assert set(RECIPE_MODELS) <= set(MODEL_TYPES)
    assert recipe_for("neox", "shakespeare") == "neox-shakespeare" and recipe_for("neox", "digits") is None
