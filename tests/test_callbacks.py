"""Barrier measurements inside training: the monitor in a plain loop, the Trainer callback,
and the guarantee both rest on, that measuring leaves the training bit for bit as it was."""
import json
import random
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch

import lmc_fast as lf
from lmc_fast.monitor import BarrierMonitor, untouched
from lmc_fast.sweep.metrics import task_loss
from zoo import logits, make_inputs, make_model


def _lm_batches(n, seed=0, batch=4):
    return [(make_inputs("gpt2", seed=seed + s, batch=batch),) * 2 for s in range(n)]


def _plain_loop(model, steps, monitor=None):
    """A user's loop: AdamW, dropout-free reference GPT-2, seeded data."""
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    batches = _lm_batches(steps, seed=100)
    model.train()
    seen = []
    for step, (x, y) in enumerate(batches, start=1):
        loss = task_loss(logits(model, x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if monitor is not None:
            res = monitor.step(model, step)
            if res is not None:
                seen.append((step, res))
    return seen


def _same_weights(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_monitor_in_a_plain_loop_measures_every_k_steps_and_changes_nothing(tmp_path):
    ref = make_model("gpt2", seed=1, dtype=torch.float32)
    data = _lm_batches(3)
    runs = []
    for with_monitor in (True, False):
        model = make_model("gpt2", seed=2, dtype=torch.float32)
        mon = BarrierMonitor(ref, data, every=4, lambdas=5, method="weight", jsonl=tmp_path / "lmc.jsonl") \
            if with_monitor else None
        runs.append((model, _plain_loop(model, 12, mon), mon))
    (model, seen, mon), (plain, _, _) = runs
    assert _same_weights(model, plain)
    assert [s for s, _ in seen] == [4, 8, 12] and all(isinstance(r, lf.BarrierResult) for _, r in seen)
    assert model.training  # train mode given back
    lines = [json.loads(line) for line in (tmp_path / "lmc.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [4, 8, 12]
    assert {"lmc/barrier", "lmc/acc_barrier", "lmc/loss_mid", "lmc/seconds"} <= set(lines[0])
    # the same numbers as measuring by hand after training, with explicit copies
    expected = lf.barrier(ref, lf.align(ref, model, "weight").apply(model), data, lambdas=5)
    got = seen[-1][1]
    assert got.barrier == pytest.approx(expected.barrier, abs=1e-5)
    assert got.loss == pytest.approx(expected.loss, abs=1e-5)
    assert mon.last_metrics["lmc/loss_mid"] == pytest.approx(expected.at(0.5)["loss"], abs=1e-5)
    assert mon.step(model, 12) is None and mon.step(model, 13) is None  # once per step, multiples of every only


def test_monitor_references_paths_and_lists(tmp_path):
    from lmc_fast.io import save_model

    refs = [make_model("gpt2", seed=s, dtype=torch.float32) for s in (3, 4)]
    save_model(refs[1], tmp_path / "ref1")
    model = make_model("gpt2", seed=5, dtype=torch.float32)
    mon = BarrierMonitor([refs[0], tmp_path / "ref1"], _lm_batches(2), every=1, lambdas=[0.0, 0.5, 1.0],
                         prefix="x/")
    results = mon.step(model, 1)
    assert len(results) == 2
    m = mon.last_metrics
    assert m["x/ref1/barrier"] == pytest.approx(results[1].barrier)
    assert m["x/barrier"] == pytest.approx((results[0].barrier + results[1].barrier) / 2)
    raw = lf.barrier(refs[1], model, _lm_batches(2), lambdas=[0.0, 0.5, 1.0], space="raw")
    assert results[1].loss == pytest.approx(raw.loss, abs=1e-5)  # method "none": raw parameters


@pytest.mark.parametrize("kw, match", [(dict(method="activation"), "method must be one of"),
                                       (dict(every=0), "every must be"), (dict(lambdas=1), "lambdas"),
                                       (dict(max_batches=0), "max_batches")])
def test_monitor_refuses_bad_arguments(kw, match):
    with pytest.raises(ValueError, match=match):
        BarrierMonitor(make_model("gpt2", dtype=torch.float32), _lm_batches(1), **kw)


def test_monitor_refuses_an_incompatible_model():
    mon = BarrierMonitor(make_model("gpt2", dtype=torch.float32), _lm_batches(1), every=1)
    with pytest.raises(ValueError, match="does not fit"):
        mon.step(make_model("gpt2", dtype=torch.float32, d=16), 1)


def test_untouched_restores_modes_flags_and_every_random_state():
    model = make_model("hf_gpt2", dtype=torch.float32).train()
    model.transformer.h[0].eval()  # a deliberately frozen submodule stays in eval mode
    model.transformer.wpe.weight.requires_grad_(False)
    before = (torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy())
    with untouched(model):
        assert not model.training and not torch.is_grad_enabled()
        model.transformer.wpe.weight.requires_grad_(True)
        torch.rand(3), random.random(), np.random.rand()  # draws that must not leak out
    assert torch.equal(torch.get_rng_state(), before[0]) and random.getstate() == before[1]
    assert np.array_equal(np.random.get_state()[1], before[2])
    assert model.training and not model.transformer.h[0].training and model.transformer.h[1].training
    assert not model.transformer.wpe.weight.requires_grad and torch.is_grad_enabled()


def test_import_lmc_fast_does_not_import_transformers():
    code = ("import sys, lmc_fast, lmc_fast.monitor; lmc_fast.LearnedAlignment; "
            "assert 'transformers' not in sys.modules, 'transformers imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


# ---------------------------------------------------------------- Hugging Face Trainer
class _TokenBlocks(torch.utils.data.Dataset):
    def __init__(self, n=64):
        self.x = torch.randint(0, 37, (n, 12), generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"input_ids": self.x[i], "labels": self.x[i]}


def _train_with_trainer(tmp_path, callbacks):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    model = make_model("hf_gpt2", seed=2, dtype=torch.float32).train()  # dropout on: draws random numbers
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "trainer"), max_steps=20, per_device_train_batch_size=8, learning_rate=1e-3,
        logging_steps=1000, save_strategy="no", report_to="none", use_cpu=True, seed=0, disable_tqdm=True,
        dataloader_num_workers=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = transformers.Trainer(model=model, args=args, train_dataset=_TokenBlocks(), callbacks=callbacks)
        trainer.train()
    return model, trainer


def test_trainer_callback_logs_four_barriers_and_leaves_training_bitwise_equal(tmp_path):
    transformers = pytest.importorskip("transformers")
    from lmc_fast.callbacks import BarrierCallback

    class Recorder(transformers.TrainerCallback):  # stands for a logger (TensorBoard, W&B) listed first
        def __init__(self):
            self.logs = []

        def on_log(self, args, state, control, logs=None, **kwargs):
            self.logs.append(dict(logs))

    ref = make_model("hf_gpt2", seed=1, dtype=torch.float32)
    recorder = Recorder()
    cb = BarrierCallback(ref, _lm_batches(2), every=5, lambdas=5, method="weight")
    model, trainer = _train_with_trainer(tmp_path, [recorder, cb])
    plain, _ = _train_with_trainer(tmp_path, None)
    assert _same_weights(model, plain)
    logged = [h for h in trainer.state.log_history if "lmc/barrier" in h]
    assert [h["step"] for h in logged] == [5, 10, 15, 20]
    assert all({"lmc/acc_barrier", "lmc/loss_mid"} <= set(h) for h in logged)
    assert sum("lmc/barrier" in logs for logs in recorder.logs) == 4  # every logger got them
    assert len(cb.monitor.history) == 4 and model.training


def test_monitor_reads_max_batches_once_and_measures_those_every_time():
    from lmc_fast.data import loader
    from lmc_fast.data.base import TokenDataset

    ds = TokenDataset(torch.randint(0, 37, (40, 12), generator=torch.Generator().manual_seed(0)), 37)
    shuffled = loader(ds, 4, shuffle=True, seed=0)  # each iteration is another epoch's order
    mon = BarrierMonitor(make_model("gpt2", seed=1, dtype=torch.float32), shuffled, every=1, max_batches=2)
    model = make_model("gpt2", seed=2, dtype=torch.float32)
    assert len(mon.data) == 2 and mon.step(model, 1).loss == mon.step(model, 2).loss
    with pytest.raises(ValueError, match="data is required"):
        BarrierMonitor(model, None, max_batches=2)


@pytest.mark.gpu
def test_monitor_leaves_a_cuda_loop_bitwise_equal_including_its_cuda_random_stream():
    """The CUDA half of the guarantee: the loop draws from the CUDA generator every step (as
    dropout would), so a measurement that advanced or reseeded it would change the weights."""
    torch.manual_seed(0)
    ref = make_model("gpt2", seed=1, dtype=torch.float32).cuda()
    data = [(x.cuda(), y.cuda()) for x, y in _lm_batches(2)]
    finals = []
    for with_monitor in (True, False):
        torch.cuda.manual_seed(123)
        model = make_model("gpt2", seed=2, dtype=torch.float32).cuda().train()
        mon = BarrierMonitor(ref, data, every=3, lambdas=5, method="weight") if with_monitor else None
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        for step, (x, y) in enumerate(_lm_batches(9, seed=100), start=1):
            x, y = x.cuda(), y.cuda()
            noise = 1.0 + 0.01 * torch.rand((), device="cuda")  # consumes the CUDA stream
            loss = noise * task_loss(logits(model, x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if mon is not None:
                mon.step(model, step)
        finals.append(model)
    assert _same_weights(*finals)
