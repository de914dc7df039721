"""The monitor and the Trainer callback on GPT-NeoX and BERT (masked batches): barriers measured while
training, and training left bit for bit as it was."""
import warnings

import pytest
import torch

import lmc_fast as lf
from lmc_fast.models.adapters import adapter_for
from lmc_fast.monitor import BarrierMonitor
from lmc_fast.sweep.metrics import task_loss, task_of
from zoo import logits, make_inputs, make_model


def _batches(kind, n, seed=0, batch=4):
    """(inputs, targets): the ids themselves for NeoX, masked ids and their labels for BERT."""
    from lmc_fast.data.masked import mask_tokens

    out = []
    for s in range(n):
        x = make_inputs(kind, seed=seed + s, batch=batch)
        out.append(mask_tokens(x, 36, seed=s) if "bert" in kind else (x, x))  # [MASK]: id 36 of the zoo's 37
    return out


def _loop(kind, model, steps, monitor=None):
    task = task_of(adapter_for(model).arch(model))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    seen = []
    for step, (x, y) in enumerate(_batches(kind, steps, seed=100), start=1):
        loss = task_loss(logits(model, x), y, task=task)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if monitor is not None and (res := monitor.step(model, step)) is not None:
            seen.append((step, res))
    return seen


@pytest.mark.parametrize("kind", ["neox", "hf_neox", "bert", "hf_bert"])
def test_monitor_measures_and_changes_nothing(kind):
    ref = make_model(kind, seed=1, dtype=torch.float32)
    finals = []
    for with_monitor in (True, False):
        model = make_model(kind, seed=2, dtype=torch.float32)
        mon = BarrierMonitor(ref, _batches(kind, 2), every=3, lambdas=3, method="weight") if with_monitor else None
        seen = _loop(kind, model, 6, mon)
        finals.append(model.state_dict())
        if with_monitor:
            assert [s for s, _ in seen] == [3, 6] and all(isinstance(r, lf.BarrierResult) for _, r in seen)
            assert all(r.barrier == r.barrier for _, r in seen)
    assert all(torch.equal(finals[0][k], finals[1][k]) for k in finals[0])


class _Blocks(torch.utils.data.Dataset):
    def __init__(self, kind):
        self.items = [(x[i], y[i]) for x, y in _batches(kind, 4, batch=8) for i in range(8)]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return {"input_ids": self.items[i][0], "labels": self.items[i][1]}


@pytest.mark.parametrize("kind", ["hf_neox", "hf_bert"])
def test_trainer_callback_on_neox_and_bert(kind, tmp_path):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from lmc_fast.callbacks import BarrierCallback

    def run(callbacks):
        model = make_model(kind, seed=2, dtype=torch.float32).train()
        args = transformers.TrainingArguments(
            output_dir=str(tmp_path / "trainer"), max_steps=6, per_device_train_batch_size=8, learning_rate=1e-3,
            logging_steps=1000, save_strategy="no", report_to="none", use_cpu=True, seed=0, disable_tqdm=True,
            dataloader_num_workers=0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer = transformers.Trainer(model=model, args=args, train_dataset=_Blocks(kind), callbacks=callbacks)
            trainer.train()
        return model, trainer

    cb = BarrierCallback(make_model(kind, seed=1, dtype=torch.float32), _batches(kind, 2), every=3, lambdas=3,
                         method="weight")
    model, trainer = run([cb])
    plain, _ = run(None)
    assert all(torch.equal(v, plain.state_dict()[k]) for k, v in model.state_dict().items())
    assert [h["step"] for h in trainer.state.log_history if "lmc/barrier" in h] == [3, 6]
