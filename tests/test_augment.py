"""Input augmentations (lmc_fast.data.augment): shapes, exact pixel moves, determinism."""
import pytest
import torch

from lmc_fast.data.augment import Compose, GaussianNoise, Mixup, RandomShift


def test_random_shift_moves_each_image_by_at_most_the_given_pixels():
    x = torch.zeros(64, 2, 8, 8)
    x[:, :, 3, 4] = 1.0  # one bright pixel on a zero background
    out = RandomShift(1)(x, torch.Generator().manual_seed(0))
    assert out.shape == x.shape
    for img in out:
        assert torch.equal(img[0], img[1])  # channels move together
        r, c = (img[0] == 1).nonzero()[0].tolist()
        assert abs(r - 3) <= 1 and abs(c - 4) <= 1 and img.sum() == 2
    moved = {tuple((img[0] == 1).nonzero()[0].tolist()) for img in out}
    assert len(moved) > 4  # shifts differ between images


def test_random_shift_fills_with_the_background_and_is_seeded():
    x = torch.randn(16, 1, 6, 6) - 5
    x[:, :, 0, :] = x[:, :, -1, :] = x[:, :, :, 0] = x[:, :, :, -1] = -9.0
    a = RandomShift(2)(x, torch.Generator().manual_seed(3))
    b = RandomShift(2)(x, torch.Generator().manual_seed(3))
    assert torch.equal(a, b)
    assert a.min() >= x.amin() and torch.equal(RandomShift(0)(x), x)
    with pytest.raises(ValueError, match="B, C, H, W"):
        RandomShift(1)(torch.randn(4, 8))
    with pytest.raises(ValueError):
        RandomShift(-1)


def test_mixup_blends_inside_the_convex_hull_and_is_not_label_preserving():
    x = torch.randn(32, 1, 4, 4)
    out = Mixup(0.5)(x, torch.Generator().manual_seed(1))
    assert out.shape == x.shape
    assert (out <= x.amax(0) + 1e-6).all() and (out >= x.amin(0) - 1e-6).all()
    assert not torch.equal(out, x)
    assert Mixup.label_preserving is False and RandomShift.__dict__.get("label_preserving", True)
    assert Compose(RandomShift(1), Mixup(1.0)).label_preserving is False
    assert Compose(RandomShift(1), GaussianNoise(0.1)).label_preserving is True
    with pytest.raises(ValueError):
        Mixup(0)
    with pytest.raises(TypeError, match="token ids"):
        Mixup(1.0)(torch.randint(0, 10, (4, 8)))


def test_gaussian_noise_has_the_requested_scale():
    x = torch.zeros(20000)
    out = GaussianNoise(0.25)(x, torch.Generator().manual_seed(0))
    assert abs(out.std().item() - 0.25) < 0.01
