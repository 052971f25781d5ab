"""On-device vectorised augmentation: the same distribution of rotations and flips as the official
per-sample loop, applied identically to images and labels."""

from collections import Counter

import pytest
import torch

from fedmedbench.fl.data import augment_harmofl


def per_sample_reference(x, y, generator):
    """HarmoFL's per-sample loop (the engine's implementation before it was vectorised)."""
    xs, ys = [], []
    for xi, yi in zip(x, y):
        k = int(torch.randint(0, 5, (1,), generator=generator))
        xi, yi = torch.rot90(xi, k, dims=(1, 2)), torch.rot90(yi, k, dims=(0, 1))
        if float(torch.rand(1, generator=generator)) < 0.75:
            dims = [(1,), (2,), (1, 2)][int(torch.randint(0, 3, (1,), generator=generator))]
            xi, yi = torch.flip(xi, dims), torch.flip(yi, tuple(d - 1 for d in dims))
        xs.append(xi)
        ys.append(yi)
    return torch.stack(xs), torch.stack(ys)


def outcome_frequencies(augment, batches=400, batch=25, seed=0):
    """How often each of the 8 dihedral images of a 2x2 pattern comes out."""
    pattern = torch.tensor([[1, 2], [3, 4]], dtype=torch.uint8)
    x = pattern.expand(batch, 1, 2, 2).clone()
    y = pattern.expand(batch, 2, 2).clone()
    generator = torch.Generator().manual_seed(seed)
    counts = Counter()
    for _ in range(batches):
        ax, ay = augment(x, y, generator)
        assert torch.equal(ax[:, 0], ay)  # labels follow their images exactly
        counts.update(tuple(img.flatten().tolist()) for img in ax[:, 0])
    total = sum(counts.values())
    return {k: v / total for k, v in counts.items()}


def test_vectorised_augmentation_has_the_reference_distribution():
    new, old = outcome_frequencies(augment_harmofl), outcome_frequencies(per_sample_reference)
    assert set(new) == set(old) and len(new) == 8
    for outcome, p in old.items():
        assert new[outcome] == pytest.approx(p, abs=0.015)  # 10,000 draws each: ~3 standard errors
    # identity: k in {0, 4} (2/5) and no flip (1/4), or k = 2 with the both-axes flip (1/5 * 3/4 * 1/3)
    assert new[(1, 2, 3, 4)] == pytest.approx(2 / 5 * 1 / 4 + 1 / 5 * 3 / 4 * 1 / 3, abs=0.015)


def test_augmentation_keeps_dtype_and_device_and_handles_any_batch():
    generator = torch.Generator().manual_seed(1)
    x = torch.randint(0, 255, (7, 3, 8, 8), dtype=torch.uint8)
    y = torch.randint(0, 2, (7, 8, 8))
    ax, ay = augment_harmofl(x, y, generator)
    assert ax.dtype == torch.uint8 and ax.shape == x.shape and ay.shape == y.shape
    # each sample is a rotation/flip of itself: its own pixels, in place in the batch
    assert torch.equal(ax.sum(dim=(1, 2, 3)), x.sum(dim=(1, 2, 3))) and torch.equal(
        ay.sum(dim=(1, 2)), y.sum(dim=(1, 2))
    )
