"""Instability analysis on a tiny recipe: units, resumption (bit for bit), refusals, the CLI glue."""
import argparse
from pathlib import Path

import pytest
import torch

from lmc_fast.instability import instability


def tiny_recipe(steps=10):
    from lmc_fast.data.base import TokenDataset
    from lmc_fast.models import GPT2Config
    from lmc_fast.recipes import Recipe

    ids = torch.randint(0, 8, (96, 12), generator=torch.Generator().manual_seed(0)) * 3 % 37  # some structure
    train, test = TokenDataset(ids[:80], 37, "toy"), TokenDataset(ids[80:], 37, "toy-test")
    return Recipe("tiny-gpt2", GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=37, block_size=12),
                  lambda: (train, test), batch_size=8,
                  hparams=dict(steps=steps, lr=1e-2, weight_decay=0.05, warmup=0.1, label_smoothing=0.0),
                  eval_batch_size=16)


def _weights(path):
    from lmc_fast.io import load_model

    return {k: v.clone() for k, v in load_model(path).state_dict().items()}


def test_instability_recipe_writes_units_table_plot_and_resumes_exactly(tmp_path):
    import shutil

    out = tmp_path / "instab"
    kw = dict(spawn_steps=[4, 0], copies=2, lambdas=3, eval_batches=1)
    first = instability(tiny_recipe(), out, **kw)
    assert first["spawn_steps"] == [0, 4] and first["units"] == {"trained": 6, "reused": 0}
    assert [(r["spawn_step"], r["copies"]) for r in first["rows"]] == [(0, [0, 1]), (4, [0, 1])]
    for row in first["rows"]:
        assert {"none", "weight"} <= set(row) and row["none"]["barrier"] >= 0.0
    assert (out / "instability.json").is_file() and (out / "instability.png").stat().st_size > 0
    child = out / "children" / "spawn4" / "copy1"
    before = _weights(child)
    assert not all(torch.equal(before[k], v) for k, v in _weights(out / "children" / "spawn4" / "copy0").items())

    again = instability(tiny_recipe(), out, **kw)  # everything reused, same numbers
    assert again["units"] == {"trained": 0, "reused": 6}
    assert [r["none"]["barrier"] for r in again["rows"]] == [r["none"]["barrier"] for r in first["rows"]]

    # a killed run lost the parent at step 4 and one child: redone from step 0's unit, bit for bit
    shutil.rmtree(out / "parent" / "step4")
    shutil.rmtree(child)
    resumed = instability(tiny_recipe(), out, **kw)
    assert resumed["units"] == {"trained": 2, "reused": 4}
    after = _weights(child)
    assert all(torch.equal(before[k], after[k]) for k in before)

    with pytest.raises(ValueError, match="other settings"):
        instability(tiny_recipe(steps=11), out, **kw)


@pytest.mark.parametrize("kw, match", [(dict(spawn_steps=[10]), "below|< the total"), (dict(copies=1), "copies"),
                                       (dict(methods=["activation"]), "methods"), (dict(spawn_steps=[]), "at least"),
                                       (dict(lambdas=1), "lambdas")])
def test_instability_refuses_bad_arguments_before_training(tmp_path, kw, match):
    from lmc_fast.recipes import instability as recipe_instability  # the recipes' entry point, same function

    with pytest.raises(ValueError, match=match):
        recipe_instability(tiny_recipe(), tmp_path / "x", **{"spawn_steps": [0], **kw})
    assert not (tmp_path / "x").exists()


class _Console:
    def __init__(self):
        self.lines = []

    def log(self, msg):
        self.lines.append(msg)

    def out(self, msg):
        self.lines.append(msg)


def _parser():
    from lmc_fast.cli.args import common_options
    from lmc_fast.cli.instability import register

    p = argparse.ArgumentParser(prog="lmc-fast")
    sub = p.add_subparsers(dest="command")
    register(sub, [common_options()])
    return p, sub.choices["instability"]


def test_cli_glue_parses_validates_and_runs(tmp_path, monkeypatch, capsys):
    import lmc_fast.recipes
    from lmc_fast.cli.console import CLIError
    from lmc_fast.cli.instability import run

    parser, sub = _parser()
    text = sub.format_help()
    assert "(default: 0 50 100 200)" in text and "(default: 2)" in text and "(default: none weight)" in text
    for bad in (["--copies", "1"], ["--spawn-steps", "-1"], ["--model", "t5"], ["--steps", "0"]):
        with pytest.raises(SystemExit):
            parser.parse_args(["instability", *bad])
    assert "--copies: must be an integer >= 2" in capsys.readouterr().err.replace("argument ", "")

    monkeypatch.setattr(lmc_fast.recipes, "recipe", lambda name: tiny_recipe())  # gpt2-shakespeare -> tiny
    out = tmp_path / "cli"
    args = parser.parse_args(["instability", "--spawn-steps", "0", "3", "--steps", "8", "--lambdas", "3",
                              "--eval-batches", "1", "--out", str(out)])
    con = _Console()
    assert run(args, con) == 0
    assert any(line.startswith("| spawn step") for line in con.lines) and (out / "instability.json").is_file()
    for argv, match in ((["--spawn-steps", "0", "8", "--steps", "8"], "below the total steps"),
                        (["--spawn-steps", "0", "0", "--steps", "8"], "given twice"),
                        (["--model", "gpt2", "--data", "digits", "--steps", "8"], "no such recipe")):
        with pytest.raises(CLIError, match=match):
            run(parser.parse_args(["instability", *argv, "--out", str(tmp_path / "bad")]), _Console())
    assert not Path(tmp_path / "bad").exists()
