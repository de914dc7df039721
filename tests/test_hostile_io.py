"""Checkpoint I/O on hostile input and under hostile conditions.

Writes: other files in a target folder survive, modes follow the umask, long legal names work,
JSON is strict, failures / SIGINT / SIGTERM leave no temp files and the old checkpoint intact,
SIGKILL leaves the old or the new checkpoint (and the next write removes what it left),
concurrent writers take turns. Loads: every nonsense config, foreign dtype, misfit weight file
and pathological JSON is one CheckpointError naming the file and the field or parameter,
raised before the model is allocated."""
import json
import math
import os
import random
import re
import resource
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

import lmc_fast.io as lio
from lmc_fast import atomic
from lmc_fast.atomic import atomic_dir, write_json
from lmc_fast.errors import OutputError
from lmc_fast.io import CheckpointError, load_model, save_model
from lmc_fast.models import ViT, ViTConfig

REPO = Path(__file__).resolve().parents[1]
TINY = dict(d_model=16, n_layer=1, n_head=2, d_mlp=32)


def tiny_vit(seed=0, **kw):
    torch.manual_seed(seed)
    return ViT(ViTConfig.digits(**{**TINY, **kw}))


def tiny_hf(n_layer=2, seed=0):
    import transformers

    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(n_layer=n_layer, n_embd=16, n_head=2, vocab_size=64, n_positions=16,
                                  bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(cfg)


def tiny_hf_vit():
    import transformers

    torch.manual_seed(0)
    cfg = transformers.ViTConfig(image_size=8, patch_size=4, num_channels=3, hidden_size=16, num_hidden_layers=1,
                                 num_attention_heads=2, intermediate_size=32, num_labels=5)
    return transformers.ViTForImageClassification(cfg)


def snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def leftovers(*folders) -> list:
    """Our temp folders/files and lock files (`.lmcf-*`) anywhere under `folders`."""
    return [p for f in folders for p in Path(f).rglob(".lmcf-*")]


def edit_json(path: Path, change) -> None:
    obj = json.loads(path.read_text())
    change(obj)
    path.write_text(json.dumps(obj))


def rewrite_tensors(path: Path, change) -> None:
    """Re-save a safetensors file after `change(tensors)`, keeping its metadata."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
    tensors = load_file(str(path))
    change(tensors)
    save_file(tensors, str(path), metadata=meta)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """One saved checkpoint of each kind; tests copy them."""
    root = tmp_path_factory.mktemp("saved")
    save_model(tiny_vit(), root / "vit")
    save_model(tiny_hf(), root / "hf")
    save_model(tiny_hf_vit(), root / "hf_vit")
    return root


def copy_of(saved, kind, tmp_path) -> Path:
    return Path(shutil.copytree(saved / kind, tmp_path / kind))


@pytest.fixture
def umask():
    old = os.umask(0o022)
    yield lambda m: os.umask(m)
    os.umask(old)


# ================================================================ writes: never lose data
@pytest.mark.parametrize("kind", ["vit", "hf"])
def test_save_into_folder_keeps_unrelated_files(tmp_path, kind):
    out = tmp_path / "out"
    (out / "other").mkdir(parents=True)
    (out / "NOTES.txt").write_text("my notes")
    save_model(tiny_vit(seed=5), out / "other")  # another checkpoint inside the folder
    (out / "pytorch_model.bin").write_bytes(b"not ours")
    before = snapshot(out)
    for seed in (1, 2):
        save_model(tiny_vit(seed=seed) if kind == "vit" else tiny_hf(seed=seed), out)
    after = snapshot(out)
    assert all(after[k] == v for k, v in before.items())  # every earlier file, byte for byte
    assert load_model(out) is not None and load_model(out / "other") is not None
    assert not leftovers(tmp_path)


def test_hf_save_removes_only_its_own_stale_files(tmp_path):
    out = tmp_path / "hf"
    out.mkdir()
    stale = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "model.safetensors.index.json",
             "lmc_fast_meta.json"]
    mine = ["NOTES.txt", "model-final.safetensors", "pytorch_model.bin"]
    for name in stale + mine:
        (out / name).write_text("x")
    save_model(tiny_hf(), out)
    names = set(os.listdir(out))
    assert not names & set(stale)
    assert set(mine) <= names and {"config.json", "model.safetensors"} <= names


def test_atomic_dir_never_deletes_existing_files(tmp_path):
    out = tmp_path / "run"
    (out / "sub").mkdir(parents=True)
    (out / "NOTES.txt").write_text("keep")
    (out / "sub" / "keep.txt").write_text("keep too")
    with atomic_dir(out) as tmp:
        (tmp / "sub").mkdir()
        (tmp / "sub" / "new.txt").write_text("new")
        (tmp / "result.json").write_text("{}")
    assert snapshot(out) == {"NOTES.txt": b"keep", "result.json": b"{}", "sub/keep.txt": b"keep too",
                             "sub/new.txt": b"new"}
    with pytest.raises(OutputError, match="already exists"):
        with atomic_dir(out, overwrite=False):
            pass
    assert not leftovers(tmp_path)


def _fail(*a, **k):
    raise RuntimeError("disk full")


@pytest.mark.parametrize("target", ["existing_folder", "new_folder", "file", "hf_existing", "json"])
def test_failed_write_leaves_old_data_and_no_temp(tmp_path, monkeypatch, target):
    import safetensors.torch
    import transformers

    names = {"existing_folder": "vit", "new_folder": "new", "file": "m.safetensors", "hf_existing": "hf",
             "json": "r.json"}
    save_model(tiny_vit(), tmp_path / "vit")
    save_model(tiny_hf(), tmp_path / "hf")
    write_json(tmp_path / "r.json", {"a": 1})
    (tmp_path / "hf" / "NOTES.txt").write_text("mine")
    before = snapshot(tmp_path)

    def partial_then_fail(self, folder, **k):
        (Path(folder) / "model.safetensors").write_bytes(b"half a file")
        raise RuntimeError("disk full")

    monkeypatch.setattr(safetensors.torch, "save_file", _fail)
    monkeypatch.setattr(transformers.GPT2LMHeadModel, "save_pretrained", partial_then_fail)
    with pytest.raises((RuntimeError, TypeError)):
        if target == "json":
            write_json(tmp_path / names[target], {"ok": 1, "bad": object()})
        elif target == "hf_existing":
            save_model(tiny_hf(seed=1), tmp_path / names[target])
        else:
            save_model(tiny_vit(seed=1), tmp_path / names[target])
    assert snapshot(tmp_path) == before
    assert sorted(os.listdir(tmp_path)) == ["hf", "r.json", "vit"]
    assert not leftovers(tmp_path)


def test_stale_temps_removed_only_if_ours_and_abandoned(tmp_path):
    import fcntl

    save_model(tiny_vit(), tmp_path / "ckpt")
    dead = tmp_path / f"{atomic.temp_prefix('ckpt')}deadbeef0000.tmp"  # a SIGKILLed writer's temp folder
    dead.mkdir()
    (dead / "data").write_bytes(b"half")
    dead_inner = tmp_path / "ckpt" / f"{atomic.temp_prefix('model.safetensors')}deadbeef0001.tmp"
    dead_inner.mkdir()
    live = tmp_path / f"{atomic.temp_prefix('ckpt')}a11ve0000000.tmp"  # a writer that is still alive
    live.mkdir()
    other = tmp_path / f"{atomic.temp_prefix('other')}deadbeef0002.tmp"  # another target's
    other.mkdir()
    user = tmp_path / ".notes.tmp"
    user.write_text("user file")
    fd = os.open(live, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        save_model(tiny_vit(seed=1), tmp_path / "ckpt")
    finally:
        os.close(fd)
    assert not dead.exists() and not dead_inner.exists()
    assert live.exists() and other.exists() and user.read_text() == "user file"


# ---------------------------------------------------------------- modes, names, JSON
@pytest.mark.parametrize("mask", [0o022, 0o027], ids=["022", "027"])
@pytest.mark.parametrize("target", ["folder", "file", "hf", "json", "atomic_dir"])
def test_modes_follow_the_umask(tmp_path, umask, mask, target):
    umask(mask)
    out = tmp_path / "a" / "b"
    if target == "folder":
        save_model(tiny_vit(), out)
    elif target == "file":
        save_model(tiny_vit(), out / "m.safetensors")
    elif target == "hf":
        save_model(tiny_hf(), out)
    elif target == "json":
        write_json(out / "r.json", {"a": 1})
    else:
        with atomic_dir(out) as tmp:
            (tmp / "f.txt").write_text("x")
            (tmp / "sub").mkdir()
            save_model(tiny_vit(), tmp / "sub" / "ckpt")
    paths = [p for p in (tmp_path / "a").rglob("*")] + [tmp_path / "a"]
    assert len(paths) > 2
    for p in paths:
        want = (0o777 if p.is_dir() else 0o666) & ~mask
        assert oct(p.stat().st_mode & 0o777) == oct(want), p


@pytest.mark.parametrize("target", ["folder", "file", "hf", "json", "atomic_file"])
def test_long_legal_names(tmp_path, target):
    if target == "json":
        path = tmp_path / ("j" * 250 + ".json")  # 255 characters: NAME_MAX
        write_json(path, {"a": 1})
        assert json.loads(path.read_text()) == {"a": 1}
    elif target == "atomic_file":
        path = tmp_path / ("p" * 251 + ".png")
        with atomic.atomic_file(path, suffix=".png") as tmp:
            assert tmp.suffix == ".png" and len(tmp.name) < 20  # writers that go by the extension still can
            tmp.write_bytes(b"png")
        assert path.read_bytes() == b"png"
    else:
        path = tmp_path / ("x" * 228 + (".safetensors" if target == "file" else "pad" * 4))  # 240 characters
        save_model(tiny_hf() if target == "hf" else tiny_vit(), path)
        assert load_model(path) is not None
    assert len(path.name) >= 240 and not leftovers(tmp_path)


def _strict(text):
    def no_constants(name):
        raise AssertionError(f"bare {name} in JSON")

    return json.loads(text, parse_constant=no_constants)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_write_json_has_no_bare_nan(tmp_path, bad):
    path = write_json(tmp_path / "r.json", {"a": bad, "b": [1.0, bad, {"c": (bad, 2)}],
                                            "t": torch.tensor([bad, 1.0])}, default=lambda o: o.tolist())
    assert _strict(path.read_text()) == {"a": None, "b": [1.0, None, {"c": [None, 2]}], "t": [None, 1.0]}


def test_metadata_nan_becomes_null(tmp_path):
    save_model(tiny_vit(), tmp_path / "c", metadata={"loss": math.nan, "curve": [1.0, math.inf]})
    assert _strict((tmp_path / "c" / "config.json").read_text())["metadata"] == {"loss": None, "curve": [1.0, None]}
    assert load_model(tmp_path / "c").lmc_fast_metadata == {"loss": None, "curve": [1.0, None]}


# ---------------------------------------------------------------- signals and kills
@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_signal_during_write_removes_temp_and_keeps_old(tmp_path, monkeypatch, sig):
    import safetensors.torch

    signum = getattr(signal, sig)
    save_model(tiny_vit(), tmp_path / "c", metadata={"v": "old"})
    before = snapshot(tmp_path)
    real = safetensors.torch.save_file

    def write_then_signal(*a, **k):
        real(*a, **k)
        signal.raise_signal(signum)

    monkeypatch.setattr(safetensors.torch, "save_file", write_then_signal)
    got = []
    # SIGTERM: the program's own handler; SIGINT: Python's default one, set here because a process started
    # in the background by a shell inherits SIGINT ignored (and an ignored signal rightly interrupts nothing)
    own = (lambda s, f: got.append(s)) if sig == "SIGTERM" else signal.default_int_handler
    previous = signal.signal(signum, own)
    handler_before = signal.getsignal(signum)
    try:
        with pytest.raises(KeyboardInterrupt if sig == "SIGINT" else InterruptedError):
            save_model(tiny_vit(seed=1), tmp_path / "c", metadata={"v": "new"})
        assert signal.getsignal(signum) is handler_before  # the program's own handler is back
    finally:
        signal.signal(signum, previous)
    assert got == ([signal.SIGTERM] if sig == "SIGTERM" else [])  # delivered once, after the cleanup
    assert snapshot(tmp_path) == before and not leftovers(tmp_path)


def test_signal_between_the_two_renames_waits_for_the_second(tmp_path, monkeypatch):
    save_model(tiny_vit(), tmp_path / "c", metadata={"v": "old"})
    real = atomic.commit
    calls = []

    def commit_with_signal(*a, **k):
        calls.append(a[1].name)
        if len(calls) == 1:
            signal.raise_signal(signal.SIGTERM)  # after the first file is staged, before any rename
        real(*a, **k)

    monkeypatch.setattr(atomic, "commit", commit_with_signal)
    got = []
    previous = signal.signal(signal.SIGTERM, lambda s, f: got.append(s))
    try:
        save_model(tiny_vit(seed=1), tmp_path / "c", metadata={"v": "new"})  # completes: the handler returns
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert calls == ["model.safetensors", "config.json"] and got == [signal.SIGTERM]
    from safetensors import safe_open

    header = json.loads((tmp_path / "c" / "config.json").read_text())
    with safe_open(str(tmp_path / "c" / "model.safetensors"), framework="pt") as f:
        assert json.loads(f.metadata()["lmc_fast"]) == header  # both files are from the new save
    assert header["metadata"] == {"v": "new"}
    assert not leftovers(tmp_path)


CHILD = """
import os, signal, sys
import torch
from lmc_fast.io import save_model
from lmc_fast.models import ViT, ViTConfig
mode, target, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
torch.manual_seed(1)
size = dict(d_model=16, n_layer=1, n_head=2, d_mlp=32) if mode != "loop" else dict(d_model=128, n_layer=4, n_head=4,
                                                                                   d_mlp=512)
model = ViT(ViTConfig.digits(**size))
if mode == "die-mid-write":
    import safetensors.torch as st
    real = st.save_file
    def save_then_die(*a, **k):
        real(*a, **k)
        os.kill(os.getpid(), signal.SIGKILL)
    st.save_file = save_then_die
print("ready", flush=True)
for i in range(n):
    save_model(model, target, metadata={"i": i})
"""


def _child(tmp_path, mode, target, n):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, str(script), mode, str(target), str(n)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)


def test_sigkill_mid_write_leaves_old_checkpoint_and_next_save_cleans(tmp_path):
    target = tmp_path / "c"
    save_model(tiny_vit(), target, metadata={"i": -1})
    before = snapshot(target)
    proc = _child(tmp_path, "die-mid-write", target, 1)
    proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL
    assert leftovers(tmp_path)  # the killed writer's temp folder (and lock file) are there ...
    assert {k: v for k, v in snapshot(target).items() if not k.startswith(".lmcf-")} == before
    assert load_model(target).lmc_fast_metadata == {"i": -1}  # ... and never read
    save_model(tiny_vit(), target, metadata={"i": 0})
    assert not leftovers(tmp_path)  # the next write of the same target removed them


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_kill_at_a_random_moment(tmp_path, sig):
    target = tmp_path / "c"
    save_model(ViT(ViTConfig.digits(d_model=128, n_layer=4, n_head=4, d_mlp=512)), target, metadata={"i": -1})
    proc = _child(tmp_path, "loop", target, 10**6)
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(random.uniform(0.05, 0.6))
    proc.send_signal(sig)
    proc.communicate(timeout=60)
    assert proc.returncode == -sig  # the program still stops
    with warnings.catch_warnings():  # SIGKILL between the two renames: new weights, old config.json
        warnings.filterwarnings("ignore" if sig == signal.SIGKILL else "error", "another save")
        m = load_model(target)  # the old or a new complete checkpoint
    assert m.lmc_fast_metadata["i"] >= -1 and m.config.d_model == 128
    if sig == signal.SIGTERM:
        assert not leftovers(tmp_path)
    save_model(m, target)
    assert not leftovers(tmp_path)


def _concurrent_writers(tmp_path, n, target_name):
    target = tmp_path / target_name
    procs = [_child(tmp_path, "concurrent", target, n) for _ in range(2)]
    for p in procs:
        _out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-2000:]
    assert load_model(target).lmc_fast_metadata == {"i": n - 1}
    assert not leftovers(tmp_path)


@pytest.mark.parametrize("target_name", ["c", "c.safetensors"])
def test_concurrent_writers(tmp_path, target_name):
    _concurrent_writers(tmp_path, 25, target_name)


@pytest.mark.slow
@pytest.mark.parametrize("target_name", ["c", "c.safetensors"])
def test_concurrent_writers_150(tmp_path, target_name):
    _concurrent_writers(tmp_path, 150, target_name)


def test_write_cut_between_weights_and_config_loads_the_weights_own_header(tmp_path):
    save_model(tiny_vit(), tmp_path / "c")
    save_model(tiny_vit(d_model=32), tmp_path / "d")
    shutil.copy(tmp_path / "d" / "model.safetensors", tmp_path / "c" / "model.safetensors")  # new weights, old config
    with pytest.warns(UserWarning, match="another save"):
        m = load_model(tmp_path / "c")
    assert m.config.d_model == 32


# ================================================================ loads: validate before allocating
def _load_fast(path):
    """load_model that must fail quickly and without allocating the sizes the config claims."""
    t0, rss0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        return load_model(path)
    finally:
        assert time.perf_counter() - t0 < 10
        assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0 < 512 * 1024  # KiB on Linux


OURS = [  # (field, value, what the message must name)
    ("d_model", 10**9, r"d_model|shape"),
    ("d_mlp", 10**7, r"blocks\.0\.mlp\.fc[12]\.(weight|bias)|d_mlp"),
    ("n_layer", -1, "n_layer"),
    ("n_layer", 10**6, "n_layer"),
    ("n_layer", 1.5, "n_layer"),
    ("n_head", 3, "n_head"),
    ("d_model", "16", "d_model"),
    ("eps", math.nan, "eps"),
    ("norm", 5, "norm"),
    ("patch_size", 0, "patch_size"),
    ("image_size", 10**12, "image_size"),
    ("num_classes", True, "num_classes"),
]


@pytest.mark.parametrize("field,value,names", OURS, ids=[f"{f}={v!r}"[:24] for f, v, _ in OURS])
def test_nonsense_config_refused_before_allocating(saved, tmp_path, field, value, names):
    ckpt = copy_of(saved, "vit", tmp_path)
    edit_json(ckpt / "config.json", lambda o: o["config"].__setitem__(field, value))
    with pytest.raises(CheckpointError, match=names) as err:
        _load_fast(ckpt)
    assert re.search(r"/vit/(config\.json|model\.safetensors): ", str(err.value)) and "\n" not in str(err.value)


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2, torch.int64])
@pytest.mark.parametrize("kind", ["vit", "hf"])
def test_foreign_dtype_refused(saved, tmp_path, dtype, kind):
    ckpt = copy_of(saved, kind, tmp_path)
    name = "head.weight" if kind == "vit" else "transformer.ln_f.weight"
    rewrite_tensors(ckpt / "model.safetensors", lambda t: t.__setitem__(name, t[name].to(dtype)))
    with pytest.raises(CheckpointError, match=rf"{name}.*{str(dtype).removeprefix('torch.')}"):
        load_model(ckpt)


DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize("case", ["deep", "huge", "list", "digits", "embedded_deep"])
def test_pathological_json_config(saved, tmp_path, case):
    ckpt = copy_of(saved, "vit", tmp_path)
    cfg = ckpt / "config.json"
    where = "config.json"
    if case == "deep":
        cfg.write_text(DEEP)
    elif case == "huge":
        cfg.write_bytes(b'{"format": "lmc_fast.model/1", "pad": "' + b"x" * (17 * 2**20) + b'"}')
    elif case == "list":
        cfg.write_text("[1, 2, 3]")
    elif case == "digits":
        cfg.write_text(cfg.read_text().replace('"d_model": 16', '"d_model": 1' + "0" * 5000, 1))
    else:  # a lone .safetensors whose lmc_fast header is 100k deep
        ckpt = tmp_path / "m.safetensors"
        shutil.copy(saved / "vit" / "model.safetensors", ckpt)
        from safetensors.torch import load_file, save_file

        save_file(load_file(str(ckpt)), str(ckpt), metadata={"lmc_fast": DEEP})
        where = "m.safetensors"
    with pytest.raises(CheckpointError, match=where) as err:
        load_model(ckpt)
    assert "\n" not in str(err.value)


# ---------------------------------------------------------------- Hugging Face folders
HF = [  # (field, value, what the message must name)
    ("n_layer", 1, r"unexpected parameter 'transformer\.h\.1\."),
    ("n_layer", 3, r"missing parameter 'transformer\.h\.2\."),
    ("n_layer", -1, "n_layer"),
    ("n_layer", 10**6, "n_layer"),
    ("n_embd", 10**9, r"n_embd|shape"),
    ("n_head", 3, "n_head"),
    ("vocab_size", 0, "vocab_size"),
    ("n_positions", "16", "n_positions"),
    ("n_inner", -5, "n_inner"),
]


@pytest.mark.parametrize("field,value,names", HF, ids=[f"{f}={v!r}"[:24] for f, v, _ in HF])
def test_hf_nonsense_config_refused_before_allocating(saved, tmp_path, field, value, names):
    ckpt = copy_of(saved, "hf", tmp_path)
    edit_json(ckpt / "config.json", lambda o: o.__setitem__(field, value))
    with pytest.raises(CheckpointError, match=names) as err:
        _load_fast(ckpt)
    assert "\n" not in str(err.value)


def test_hf_vit_config_deeper_than_its_weights(saved, tmp_path):
    ckpt = copy_of(saved, "hf_vit", tmp_path)  # transformers renames ViT's modules on load: names still checked
    edit_json(ckpt / "config.json", lambda o: o.__setitem__("num_hidden_layers", 2))
    with pytest.raises(CheckpointError, match=r"missing parameter 'vit\.(layers|encoder\.layer)\.1\."):
        load_model(ckpt)


@pytest.mark.parametrize("case", ["extra", "missing", "index_escape", "deep_generation_config", "deep_config",
                                  "names_unmatchable"])
def test_hf_folder_misfits(saved, tmp_path, monkeypatch, case):
    ckpt = copy_of(saved, "hf", tmp_path)
    weights = ckpt / "model.safetensors"
    if case == "names_unmatchable":  # transformers' renaming rules unavailable: the amount of data still must fit
        monkeypatch.setattr(lio, "_hf_renamer", lambda model: None)
        edit_json(ckpt / "config.json", lambda o: o.__setitem__("n_inner", 48))
        names = r"model\.safetensors: holds \d+ weight values, the GPT2LMHeadModel config describes \d+"
    elif case == "extra":
        rewrite_tensors(weights, lambda t: t.__setitem__("transformer.h.0.extra.weight", torch.zeros(2)))
        names = r"model\.safetensors: unexpected parameter 'transformer\.h\.0\.extra\.weight'"
    elif case == "missing":
        rewrite_tensors(weights, lambda t: t.pop("transformer.ln_f.bias"))
        names = r"model\.safetensors: missing parameter 'transformer\.ln_f\.bias'"
    elif case == "index_escape":
        shutil.copy(weights, tmp_path / "evil.safetensors")
        weights.unlink()
        (ckpt / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "../evil.safetensors"}}))
        names = r"model\.safetensors\.index\.json.*\.\./evil"
    elif case == "deep_generation_config":
        (ckpt / "generation_config.json").write_text(DEEP)
        names = r"generation_config\.json.*too deep"
    else:
        (ckpt / "config.json").write_text(DEEP)
        names = r"config\.json.*too deep"
    with pytest.raises(CheckpointError, match=names):
        load_model(ckpt)
