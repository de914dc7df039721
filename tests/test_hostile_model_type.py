"""A config whose model_type is not a string (a list, an object) is refused in one line naming the
file and the field: it ended in "TypeError: unhashable type" from the registry lookup."""
import json

import pytest
import torch

from lmc_fast.cli import main
from lmc_fast.io import load_model, save_model
from lmc_fast.models import ViT, ViTConfig


def _ours(tmp_path):
    torch.manual_seed(0)
    save_model(ViT(ViTConfig.digits(d_model=16, n_layer=1, n_head=2, d_mlp=32)), tmp_path / "m")
    return tmp_path / "m"


def _hugging_face(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64, n_positions=16)).save_pretrained(tmp_path / "m")
    return tmp_path / "m"


# (case id, maker of a checkpoint folder, the bad model_type)
CASES = [(f"{kind}-{name}", make, value) for kind, make in (("ours", _ours), ("hf", _hugging_face))
         for name, value in (("list", ["gpt2"]), ("object", {"type": "gpt2"}), ("nested-list", [["vit"]]))]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_a_model_type_that_is_not_a_string_is_refused_in_one_line(tmp_path, capsys, case):
    _, make, value = case
    folder = make(tmp_path)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["model_type"] = value
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"config\.json: .*model_type"):
        load_model(folder)
    capsys.readouterr()  # (what saving printed)
    rc = main(["align", str(folder), str(folder), "--out", str(tmp_path / "al.safetensors"), "-q"])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1 and "model_type" in err, err
