"""Resume inside a sweep (EvalOptions.checkpoint): an interrupted sweep, re-run with the same
folder, evaluates only what is left and ends with the numbers of an uninterrupted one."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import lmc_fast as lf
from lmc_fast.models import functional as Fn
from lmc_fast.sweep.checks import fused_sweep_bytes
from lmc_fast.sweep.evaluate import EvalOptions, evaluate_mixtures
from lmc_fast.sweep.interpolate import models_params
from lmc_fast.sweep.metrics import MetricSums
from zoo import make_inputs, make_model

TESTS = Path(__file__).parent


def sweep_inputs(n_batches=12, batch=4, seed=0):
    """Two float64 ViTs (raw parameters), 5 mixtures and `n_batches` small classification batches."""
    a, b = make_model("vit", seed=1), make_model("vit", seed=2)
    arch, params = models_params([a, b], "raw")
    lams = torch.linspace(0, 1, 5, dtype=torch.float64)
    W = torch.stack([1 - lams, lams], 1)
    data = []
    for s in range(n_batches):
        x = make_inputs("vit", seed=seed + 100 + s, batch=batch)
        data.append((x, torch.randint(0, 5, (batch,), generator=torch.Generator().manual_seed(seed + s))))
    return arch, params, W, data


def options(folder=None, **kw):
    return EvalOptions(dtype=torch.float64, max_tokens=64, checkpoint=folder, **kw)


@pytest.fixture
def embeds(monkeypatch):
    """Counts the batches the batched engine evaluates (each sums the batch's embeddings once)."""
    count = [0]
    real = Fn.embed_sum

    def counting(*args, **kw):
        count[0] += 1
        return real(*args, **kw)

    monkeypatch.setattr(Fn, "embed_sum", counting)
    return count


def interrupt_after(monkeypatch, calls: int):
    """MetricSums.add raises on its `calls`+1-th call: the sweep dies mid-data."""
    real, seen = MetricSums.add, [0]

    def add(self, *args):
        seen[0] += 1
        if seen[0] > calls:
            raise KeyboardInterrupt("test: killed mid-sweep")
        return real(self, *args)

    monkeypatch.setattr(MetricSums, "add", add)


def same(rows_a, rows_b, tol=1e-12):
    for ra, rb in zip(rows_a, rows_b, strict=True):
        for k in ("loss", "acc", "ece"):
            assert abs(ra[k] - rb[k]) <= tol, (k, ra[k], rb[k])


def test_interrupted_sweep_resumes_with_only_the_remaining_batches(tmp_path, monkeypatch, embeds):
    arch, params, W, data = sweep_inputs()
    fresh = evaluate_mixtures(arch, params, W, data, options())
    assert embeds[0] == 12
    folder = tmp_path / "ckpt"
    with monkeypatch.context() as m:
        interrupt_after(m, 5 * 7)  # 5 mixtures: dies while evaluating batch 8
        with pytest.raises(KeyboardInterrupt):
            evaluate_mixtures(arch, params, W, data, options(folder, checkpoint_every=3))
    (record,) = [json.loads(p.read_text()) for p in folder.glob("*.json")]
    assert record["batches"] == 6 and not record["done"]
    embeds[0] = 0
    resumed = evaluate_mixtures(arch, params, W, data, options(folder, checkpoint_every=3))
    assert embeds[0] == 12 - 6  # the recorded 6 batches were read, not evaluated
    same(resumed, fresh)
    # finished: read back, nothing evaluated, the same numbers
    embeds[0] = 0
    again = evaluate_mixtures(arch, params, W, data, options(folder, checkpoint_every=3))
    assert embeds[0] == 0
    same(again, fresh, tol=0.0)
    assert json.loads(next(folder.glob("*.json")).read_text())["done"]


def test_changed_data_or_lambdas_do_not_reuse_records(tmp_path, embeds):
    arch, params, W, data = sweep_inputs()
    folder = tmp_path / "ckpt"
    evaluate_mixtures(arch, params, W, data, options(folder, checkpoint_every=4))
    # other data (one batch changed inside the recorded data): warned, recomputed in full
    other = list(data)
    other[2] = (other[2][0] + 0.5, other[2][1])
    embeds[0] = 0
    with pytest.warns(UserWarning, match="differ"):
        rows = evaluate_mixtures(arch, params, W, other, options(folder, checkpoint_every=4))
    assert embeds[0] == 12
    same(rows, evaluate_mixtures(arch, params, W, other, options()), tol=0.0)
    # more data than the finished record saw
    with pytest.warns(UserWarning, match="more than"):
        rows = evaluate_mixtures(arch, params, W, other + other[:1], options(folder, checkpoint_every=4))
    same(rows, evaluate_mixtures(arch, params, W, other + other[:1], options()), tol=0.0)
    # other lambdas: another block key, so no record applies
    W2 = W.flip(0) * 0.5 + 0.25
    embeds[0] = 0
    rows = evaluate_mixtures(arch, params, W2, data, options(folder))
    assert embeds[0] == 12
    same(rows, evaluate_mixtures(arch, params, W2, data, options()), tol=0.0)
    # a file that is no record at all is refused and kept (it may be the user's), not overwritten
    for p in folder.glob("*.json"):
        p.write_text("{not json")
    with pytest.raises(ValueError, match="not a sweep record"):
        evaluate_mixtures(arch, params, W2, data, options(folder))
    assert all(p.read_text() == "{not json" for p in folder.glob("*.json"))
    # a record of this sweep that fails validation is not trusted either: recomputed
    for p in folder.glob("*.json"):
        p.write_text(json.dumps({"format": 1, "key": p.stem, "batches": "many"}))
    with pytest.warns(UserWarning, match="not a record"):
        rows = evaluate_mixtures(arch, params, W2, data, options(folder))
    same(rows, evaluate_mixtures(arch, params, W2, data, options()), tol=0.0)


def test_blocks_that_finished_are_reused(tmp_path, monkeypatch, embeds):
    """max_memory for two mixtures a block: 3 blocks; a sweep killed in the last one re-evaluates only it."""
    arch, params, W, data = sweep_inputs(n_batches=6)
    one = fused_sweep_bytes(arch, params[0], 1, 2, torch.float64, 64)
    two = fused_sweep_bytes(arch, params[0], 2, 2, torch.float64, 64)
    plan = {}
    fresh = evaluate_mixtures(arch, params, W, data, options(max_memory=two + 10, report=plan))
    assert plan["blocks"] == 3 and two + 10 < fused_sweep_bytes(arch, params[0], 3, 2, torch.float64, 64)
    folder = tmp_path / "ckpt"
    with monkeypatch.context() as m:
        interrupt_after(m, 2 * 6 + 2 * 6 + 1 * 4)  # blocks 1 and 2 done, block 3 (one mixture) dies at batch 5
        with pytest.raises(KeyboardInterrupt):
            evaluate_mixtures(arch, params, W, data, options(folder, max_memory=two + 10, checkpoint_every=2))
    assert len(list(folder.glob("*.json"))) == 3
    embeds[0] = 0
    resumed = evaluate_mixtures(arch, params, W, data, options(folder, max_memory=two + 10, checkpoint_every=2))
    assert embeds[0] == 6 - 4  # the last block's last two batches only
    same(resumed, fresh)
    assert one < two


def test_barrier_and_simplex_take_checkpoint(tmp_path, embeds):
    arch, params, W, data = sweep_inputs(n_batches=4)
    a, b = make_model("vit", seed=1), make_model("vit", seed=2)
    ref = lf.barrier(a, b, data, 4, max_tokens=64)
    got = lf.barrier(a, b, data, 4, max_tokens=64, checkpoint=tmp_path / "b")
    embeds[0] = 0
    again = lf.barrier(a, b, data, 4, max_tokens=64, checkpoint=tmp_path / "b")
    assert embeds[0] == 0 and again.barrier == got.barrier and abs(got.barrier - ref.barrier) < 1e-12
    s_ref = lf.simplex([a, b], data, n=2, max_tokens=64)
    s_got = lf.simplex([a, b], data, n=2, max_tokens=64, checkpoint=tmp_path / "s")
    assert abs(s_got["centroid"]["loss"] - s_ref["centroid"]["loss"]) < 1e-12
    with pytest.raises(ValueError, match="fused engine"):
        lf.barrier(a, b, data, 4, engine="loop", checkpoint=tmp_path / "l")


CHILD = """
import sys, time
sys.path.insert(0, {tests!r})
import torch
from lmc_fast.models import functional as Fn
from lmc_fast.sweep.evaluate import evaluate_mixtures
from test_sweep_resume import options, sweep_inputs

real = Fn.embed_sum  # what the batched engine calls once per batch
def slow(*a, **k):
    time.sleep(0.02)  # a slow sweep, so the kill lands mid-data
    return real(*a, **k)
Fn.embed_sum = slow
arch, params, W, data = sweep_inputs(n_batches=120, batch=2)
evaluate_mixtures(arch, params, W, data, options({folder!r}, checkpoint_every=5))
print("finished", flush=True)
"""


def test_sigkill_mid_sweep_then_rerun(tmp_path, embeds):
    folder = tmp_path / "ckpt"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS.parent), os.environ.get("PYTHONPATH", "")]))
    child = subprocess.Popen([sys.executable, "-c", CHILD.format(tests=str(TESTS), folder=str(folder))], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not list(folder.glob("*.json")) and time.monotonic() < deadline and child.poll() is None:
            time.sleep(0.05)
        time.sleep(0.3)  # a few more records, and a kill at an arbitrary point among them
        child.send_signal(signal.SIGKILL)
    finally:
        child.wait()
    assert child.returncode == -signal.SIGKILL, child.stderr.read().decode()[-2000:]
    (path,) = folder.glob("*.json")
    done = json.loads(path.read_text())["batches"]
    assert 5 <= done < 120
    arch, params, W, data = sweep_inputs(n_batches=120, batch=2)
    embeds[0] = 0
    resumed = evaluate_mixtures(arch, params, W, data, options(folder, checkpoint_every=5))
    assert embeds[0] == 120 - done
    same(resumed, evaluate_mixtures(arch, params, W, data, options()))


def test_grid_unit_killed_mid_sweep_resumes_its_sweep(tmp_path, monkeypatch, embeds):
    """The grid sweeps each unit under sweeps/<unit key>/: a unit killed mid-sweep continues from
    its last record (16 batches) and ends with the uninterrupted numbers; the folder goes once stored."""
    import lmc_fast.grid as grid
    from lmc_fast.io import save_model
    from lmc_fast.models import ViT, ViTConfig

    paths = []
    for seed in range(2):  # untrained tiny ViTs: the sweep, not the models, is under test
        torch.manual_seed(seed)
        save_model(ViT(ViTConfig.digits(d_model=16, n_layer=1, n_head=2, d_mlp=32)), tmp_path / f"m{seed}")
        paths.append(str(tmp_path / f"m{seed}"))
    spec = {"data": {"spec": "digits", "max_batches": 20, "batch_size": 8}, "models": {"paths": paths},
            "grid": {"pairs": "all", "methods": ["none"], "lambdas": 3}, "methods": {}}
    whole = grid.run(spec, tmp_path / "whole", quiet=True)["records"]
    out = tmp_path / "killed"
    with monkeypatch.context() as m:
        interrupt_after(m, 3 * 18)  # 3 lambdas; records after 16 batches, killed in batch 19
        with pytest.raises(KeyboardInterrupt):
            grid.run(spec, out, quiet=True)
    (record,) = (out / "sweeps").glob("*/*.json")
    assert json.loads(record.read_text())["batches"] == 16
    embeds[0] = 0
    resumed = grid.run(spec, out, quiet=True)["records"]
    assert embeds[0] == 20 - 16
    assert resumed[0]["barrier"] == whole[0]["barrier"]
    assert resumed[0]["curve"]["loss"] == whole[0]["curve"]["loss"]
    assert not list((out / "sweeps").iterdir())
