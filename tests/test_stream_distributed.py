"""Streamed matching and sweeps under torchrun: 2 gloo ranks split the layers (matching) and the batches
(the barrier; each rank aligns half of B's tensors and broadcasts them), all-reduce the statistics, and every
rank returns what one process returns."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = r"""
import json, sys
import torch
import lmc_fast as lf
sys.path.insert(0, sys.argv[5])
from zoo import make_inputs, make_targets
torch.set_num_threads(1)
pa, pb, out, mode = sys.argv[1:5]
two = mode == "two"
al = lf.align(pa, pb, "weight", distributed=True if two else None)
data = [(x, make_targets("llama", x, seed=s)) for s, x in ((s, make_inputs("llama", seed=s)) for s in range(3))]
res = lf.barrier(pa, pb, data, lambdas=5, align=al, dtype=torch.float64, distributed=True if two else None)
rank = torch.distributed.get_rank() if two else 0
al.save(f"{out}.{rank}.safetensors")
json.dump({"objective": al.info["objective"], "ranks": al.info["ranks"], "barrier": res.to_dict(),
           "read": al.info["bytes_read"], "read_here": al.info["bytes_read_here"]},
          open(f"{out}.{rank}.json", "w"))
"""


def _env():
    return {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}


def test_two_gloo_ranks_equal_one_process(tmp_path):
    from lmc_fast.io import save_model
    from lmc_fast.symmetry import Alignment
    from zoo import make_model

    pa, pb = tmp_path / "a", tmp_path / "b"
    save_model(make_model("llama", 0, n_layer=3), pa)  # 3 layers + the outer block: ranks take 2 blocks each
    save_model(make_model("llama", 1, n_layer=3), pb)
    script = tmp_path / "run.py"
    script.write_text(SCRIPT)
    tests = str(Path(__file__).parent)
    subprocess.run([sys.executable, str(script), pa, pb, tmp_path / "one", "one", tests], env=_env(), check=True,
                   timeout=300)
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(script), pa, pb, tmp_path / "two", "two", tests], env=_env(), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    one = Alignment.load(tmp_path / "one.0.safetensors")
    r1 = json.loads((tmp_path / "one.0.json").read_text())
    for rank in range(2):
        two = Alignment.load(tmp_path / f"two.{rank}.safetensors")
        for name, el in one.elements.items():
            for key, t in el.items():
                u = two.elements[name][key]
                if t.is_floating_point():
                    assert torch.allclose(t, u, atol=1e-10), (name, key)
                else:
                    assert torch.equal(t, u), (name, key)
        r2 = json.loads((tmp_path / f"two.{rank}.json").read_text())
        assert r2["ranks"] == 2 and r1["ranks"] == 1
        assert r2["read"] == r1["read"] and 0 < r2["read_here"] < 0.8 * r1["read"]  # each rank read its share
        assert r2["objective"] == pytest.approx(r1["objective"], rel=1e-12)
        for key in ("loss", "acc", "ece"):
            assert r2["barrier"][key] == pytest.approx(r1["barrier"][key], rel=1e-9, abs=1e-12), key
        assert r2["barrier"]["streamed"]["ranks"] == 2 and r1["barrier"]["streamed"]["aligned_here"] == 1.0
        assert 0.35 < r2["barrier"]["streamed"]["aligned_here"] < 0.65  # each rank moved about half of B


MERGE_SCRIPT = r"""
import sys
import torch
import lmc_fast as lf
torch.set_num_threads(1)
out, mode, *paths = sys.argv[1:]
two = mode == "two"
folders, als = lf.merge_many(paths, "weight", rounds=1, out=f"{out}-models", return_alignments=True,
                             distributed=True if two else None)
rank = torch.distributed.get_rank() if two else 0
for i, al in enumerate(als):
    al.save(f"{out}.{rank}.{i}.safetensors")
"""


def test_streamed_merge_many_on_two_gloo_ranks_equals_one_process(tmp_path):
    """MergeMany's mean mode under torchrun: each rank solves its layers of every re-alignment; every rank
    returns the one-process alignments, and rank 0 alone writes the same aligned copies."""
    from lmc_fast.io import load_model, save_model
    from lmc_fast.models.adapters import standard_params
    from lmc_fast.symmetry import Alignment
    from zoo import make_model

    paths = [tmp_path / f"m{s}" for s in range(3)]
    for s, p in enumerate(paths):
        save_model(make_model("llama", s, n_layer=3), p)
    script = tmp_path / "merge.py"
    script.write_text(MERGE_SCRIPT)
    subprocess.run([sys.executable, str(script), tmp_path / "one", "one", *paths], env=_env(), check=True,
                   timeout=300)
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(script), tmp_path / "two", "two", *paths], env=_env(), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    for i in range(3):
        one = Alignment.load(tmp_path / f"one.0.{i}.safetensors")
        for rank in range(2):
            two = Alignment.load(tmp_path / f"two.{rank}.{i}.safetensors")
            for name, el in one.elements.items():
                for key, t in el.items():
                    u = two.elements[name][key]
                    assert (torch.allclose(t, u, atol=1e-10) if t.is_floating_point() else torch.equal(t, u)), \
                        (i, name, key)
        _, want = standard_params(load_model(tmp_path / "one-models" / f"aligned_{i}"))
        _, got = standard_params(load_model(tmp_path / "two-models" / f"aligned_{i}"))
        assert max(float((got[n] - want[n]).abs().max()) for n in want) < 1e-10
