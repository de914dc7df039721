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
    from lmc_fast.cli.train import MODEL_TYPES, TRAINED_ELSEWHERE
    from lmc_fast.models.adapters import HUGGING_FACE, REFERENCE, adapter_for

    assert tuple(t for t in REFERENCE if t not in TRAINED_ELSEWHERE) == MODEL_TYPES
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


def test_every_method_runs_with_exactly_the_options_it_lists():
    """A listed option reaches the method's runner, and every keyword the runner takes is listed: nothing
    `lf.align` accepts is dropped on the way, nothing the runner could take is unreachable."""
    import inspect

    for m in methods.REGISTRY.values():
        if not m.aligns:
            assert m.options == m.runtime == () and m.match_params is None
            continue
        sig = inspect.signature(m.run)
        taken = {n for n, p in sig.parameters.items() if p.kind is p.KEYWORD_ONLY}
        assert taken == set(m.options) | set(m.runtime), m.name


def test_an_option_of_another_method_is_refused_in_one_line():
    import pytest
    import torch

    import lmc_fast as lf
    from zoo import make_inputs, make_model

    a, b = make_model("vit", seed=1), make_model("vit", seed=2)
    data = [(make_inputs("vit", seed=0), torch.zeros(3, dtype=torch.long))]
    cases = [("weight", dict(steps=10), "steps is an option of method 'learned', not 'weight'"),
             ("activation", dict(seed=1), "seed is an option of methods 'permutation', 'weight' and 'learned', "
                                          "not 'activation'"),
             ("weight", dict(heads=False), "heads is an option of method 'permutation', not 'weight'"),
             ("permutation", dict(token_counts=[1, 2]), "token_counts is an option of method 'weight'"),
             ("learned", dict(dtype=torch.float32), "dtype is an option of methods 'permutation', 'weight' and "
                                                    "'activation', not 'learned'"),
             ("weight", dict(colour="red"), "unknown option 'colour'; method 'weight' takes seed, max_iter")]
    for method, options, message in cases:
        with pytest.raises(ValueError, match=message.replace("(", r"\(")) as info:
            lf.align(a, b, method, data=data, **options)
        assert "\n" not in str(info.value)


def test_every_group_kind_has_a_matcher():
    from lmc_fast.match.kinds import MATCHERS
    from lmc_fast.symmetry.groups import KINDS
    from lmc_fast.symmetry.spec import KINDS as SPEC_KINDS

    assert set(MATCHERS) == set(KINDS) == set(SPEC_KINDS)


def test_learn_modes_select_latents_by_kind_tags_on_every_family():
    """`learn` picks latents by what they are (a permutation, a continuous map, the residual's), so BERT's
    pooler and masked-LM transform permutations and its residual permutation follow the mode too."""
    import lmc_fast as lf
    from zoo import make_model

    for kind in ("hf_bert", "llama", "neox"):
        a, b = make_model(kind, seed=1), make_model(kind, seed=2)
        trains = {}
        for mode in ("all", "continuous", "permutations", "residual", "heads", "mlp", "no_residual"):
            la = lf.LearnedAlignment(a, b, init="identity", learn=mode)
            trains[mode] = {n.split(".", 3)[3] for n, p in la.named_parameters() if p.requires_grad}
        everything = trains["all"]
        assert trains["permutations"] | trains["continuous"] == everything
        assert not trains["permutations"] & trains["continuous"]
        assert all(n.endswith(("perm", "qperm")) for n in trains["permutations"])
        assert trains["residual"] == {n for n in everything if n.startswith("residual.")}
        assert trains["no_residual"] == everything - trains["residual"]
        assert trains["heads"] == {n for n in everything if n.startswith("heads.")} and trains["heads"]
        assert trains["mlp"] == {n for n in everything if n.startswith("mlp.")} == {"mlp.perm"}
        if kind == "hf_bert":  # post-norm: the residual is a permutation; the masked-LM transform units too
            assert {"residual.perm", "head_transform.perm"} <= trains["permutations"]
