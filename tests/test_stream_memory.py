"""A streamed match's memory stays under a bound the in-memory path exceeds, and a streamed merge or apply
holds about a layer per model: each run in its own process, measuring its own high-water mark (VmHWM, reset
after a warm-up that loads every library)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PROBE = r"""
import json, sys, tempfile
mode, pa, pb = sys.argv[1:4]
import lmc_fast as lf
import lmc_fast.stream.pieces as pieces
from lmc_fast.io import load_model, save_model
pieces.ROW_BLOCK_BYTES = 4 * 2**20
sys.path.insert(0, sys.argv[4])
from zoo import make_model

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024

d = tempfile.mkdtemp()
save_model(make_model("llama", 0), d + "/a"); save_model(make_model("llama", 1), d + "/b")
lf.align(d + "/a", d + "/b", "weight", max_iter=2)  # every library loaded and used once
lf.align(load_model(d + "/a"), load_model(d + "/b"), "weight", max_iter=2)
open("/proc/self/clear_refs", "w").write("5")  # VmHWM := VmRSS
rss = status("VmRSS:")
if mode == "stream":
    al = lf.align(pa, pb, "weight", max_iter=2)
else:
    al = lf.align(load_model(pa), load_model(pb), "weight", max_iter=2)
print(json.dumps({"peak": status("VmHWM:") - rss, "objective": al.info["objective"][-1]}))
"""


WRITE_PROBE = r"""
import json, sys, tempfile
from pathlib import Path
mode, pa, pb = sys.argv[1:4]
from lmc_fast.stream.generate import llama_on_meta, write_random
from lmc_fast.stream.paths import apply_to_path, merge_paths
from lmc_fast.stream.checkpoint import StreamedCheckpoint
from lmc_fast.symmetry import Alignment, canonical_spec

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024

def run(pa, pb, out):
    al = Alignment.random(canonical_spec(StreamedCheckpoint(pa).arch), seed=3)
    if mode == "merge":
        merge_paths([pa, pb], out, [None, al], force=True)
    else:
        apply_to_path(al, pb, out, force=True)

d = Path(tempfile.mkdtemp())
model = llama_on_meta("llama-tiny")
run(write_random(d / "a", model, 0), write_random(d / "b", model, 1), d / "warm")  # every library loaded once
open("/proc/self/clear_refs", "w").write("5")  # VmHWM := VmRSS
rss = status("VmRSS:")
run(pa, pb, d / "out")
print(json.dumps({"peak": status("VmHWM:") - rss}))
"""


def _peak(mode, pa, pb, probe=PROBE) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    tests = str(Path(__file__).parent)
    out = subprocess.run([sys.executable, "-c", probe, mode, str(pa), str(pb), tests], capture_output=True,
                         text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux's /proc/self/clear_refs")
def test_streamed_match_stays_under_the_pair_size_that_in_memory_exceeds(tmp_path):
    from lmc_fast.stream.generate import llama_on_meta, write_random

    model = llama_on_meta("llama-tiny", vocab_size=32000)  # 19.6M parameters, most in the embedding and head
    pa, pb = write_random(tmp_path / "a", model, 0), write_random(tmp_path / "b", model, 1)
    n = sum(p.numel() for p in model.parameters())
    pair_f64 = 2 * 8 * n  # what the in-memory path holds at least: both canonical forms in float64
    streamed, in_memory = _peak("stream", pa, pb), _peak("memory", pa, pb)
    assert streamed["objective"] == pytest.approx(in_memory["objective"], rel=1e-9)
    assert in_memory["peak"] > pair_f64, (in_memory, pair_f64)
    assert streamed["peak"] < 0.6 * pair_f64, (streamed, pair_f64)


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux's /proc/self/clear_refs")
def test_streamed_merge_and_apply_hold_a_few_layers_not_the_model(tmp_path):
    """Layers dominate this shape (4 x 64 MiB in float32, a 256-token vocabulary). A merge must drop each
    model's piece as it is summed and the last block's sum before reading the next: holding both pieces,
    the transformed copy and the last block's sum as well (as it once did) cost 10 layers; now about 4."""
    from lmc_fast.stream.generate import llama_on_meta, write_random

    shape = dict(hidden_size=1024, intermediate_size=4096, num_attention_heads=8, num_key_value_heads=8,
                 vocab_size=256, num_hidden_layers=4)
    model = llama_on_meta("llama-tiny", **shape)
    pa, pb = write_random(tmp_path / "a", model, 0), write_random(tmp_path / "b", model, 1)
    layer = 4 * sum(p.numel() for n, p in model.named_parameters() if ".0." in n)  # one layer in float32
    merge, apply = _peak("merge", pa, pb, WRITE_PROBE)["peak"], _peak("apply", pa, pb, WRITE_PROBE)["peak"]
    assert merge < 6 * layer, (merge / layer, "layers")
    assert apply < 4.5 * layer, (apply / layer, "layers")


MEAN_PROBE = r"""
import json, sys, tempfile
from pathlib import Path
from lmc_fast.match.weight import match_pieces
from lmc_fast.stream.checkpoint import StreamedCheckpoint
from lmc_fast.stream.generate import llama_on_meta, write_random
from lmc_fast.stream.pieces import MeanOfOthers
from lmc_fast.symmetry import Alignment, canonical_spec
paths = sys.argv[1:]

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024

def sweep(paths):
    cks = [StreamedCheckpoint(p) for p in paths]
    spec = canonical_spec(cks[0].arch)
    elements = [Alignment.random(spec, seed=i).elements for i in range(len(cks))]
    match_pieces(spec, MeanOfOthers(cks, spec, 1, elements), max_iter=1, polish_iter=0)

d = Path(tempfile.mkdtemp())
small = llama_on_meta("llama-tiny", hidden_size=64, intermediate_size=128, vocab_size=64, num_hidden_layers=1)
sweep([write_random(d / f"w{i}", small, i) for i in range(3)])  # every library loaded once, little heap kept
open("/proc/self/clear_refs", "w").write("5")  # VmHWM := VmRSS
rss = status("VmRSS:")
sweep(paths)
print(json.dumps({"peak": status("VmHWM:") - rss}))
"""


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux's /proc/self/clear_refs")
def test_streamed_merge_many_sweep_holds_a_few_layers_not_the_models(tmp_path):
    """MergeMany's re-alignment streamed (MeanOfOthers): the models' blocks are read one after another, each
    added to the mean and dropped, so a sweep over three 8-layer checkpoints holds what a pair's sweep holds
    (about 10 float64 layers measured, 9.7 for a pair; 13 when every model's block stayed until the next
    read), not the 24 of the three models."""
    shape = dict(hidden_size=256, intermediate_size=1024, num_attention_heads=4, num_key_value_heads=4,
                 vocab_size=256, num_hidden_layers=8)
    from lmc_fast.stream.generate import llama_on_meta, write_random

    model = llama_on_meta("llama-tiny", **shape)
    paths = [str(write_random(tmp_path / f"m{i}", model, i)) for i in range(3)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", MEAN_PROBE, *paths], capture_output=True, text=True, env=env,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    peak = json.loads(out.stdout.strip().splitlines()[-1])["peak"]
    d, f = shape["hidden_size"], shape["intermediate_size"]
    layer = 8 * (4 * d * d + 3 * d * f + 2 * d)  # one layer in float64
    assert peak < 11.5 * layer, (peak / layer, "layers")
