"""Dice definitions: hand-computed cases, and the clean Dice against MONAI as the reference."""

import numpy as np
import pytest
import torch

from fedmedbench.losses import dice_ce_loss, soft_dice_loss
from fedmedbench.metrics import SegmentationMeter, dice_paper_per_sample


def logits_for(pred: np.ndarray, num_classes: int = 2) -> torch.Tensor:
    """Logits whose argmax is ``pred`` (B x H x W)."""
    return torch.nn.functional.one_hot(torch.from_numpy(pred).long(), num_classes).permute(0, 3, 1, 2).float() * 5


def test_dice_paper_hand_computed():
    # One 2x2 sample: truth fg at 2 pixels, prediction fg at 1 of them + 1 wrong pixel.
    truth = np.array([[[1, 1], [0, 0]]])
    pred = np.array([[[1, 0], [1, 0]]])
    # fg: 2*1/(2+2) = 0.5 ; bg: truth bg {(1,0),(1,1)}, pred bg {(0,1),(1,1)} -> 2*1/4 = 0.5
    assert dice_paper_per_sample(logits_for(pred), torch.from_numpy(truth).long()).tolist() == [0.5]
    # All background in both: background scores 1 and the absent class 0 (as in the papers' code).
    empty = np.zeros((1, 2, 2), int)
    assert dice_paper_per_sample(logits_for(empty), torch.from_numpy(empty).long()).tolist() == [0.5]


def test_dice_paper_averages_samples():
    truth = np.array([[[1, 1], [0, 0]], [[1, 1], [0, 0]]])
    pred = np.array([[[1, 1], [0, 0]], [[1, 0], [1, 0]]])
    meter = SegmentationMeter(2)
    meter.update(logits_for(pred), torch.from_numpy(truth).long(), ["c1", "c2"], loss=0.0)
    assert meter.compute()["dice_paper"] == pytest.approx((1.0 + 0.5) / 2)


def test_dice_fg_pools_slices_per_case_like_monai():
    from monai.metrics import DiceMetric

    rng = np.random.default_rng(0)
    truth = (rng.random((9, 12, 12)) > 0.6).astype(int)
    pred = np.where(rng.random((9, 12, 12)) > 0.2, truth, 1 - truth)
    groups = ["a"] * 4 + ["b"] * 3 + ["c"] * 2
    meter = SegmentationMeter(2)
    for start in (0, 5):  # two batches that cut a case in half
        sl = slice(start, start + 5)
        meter.update(logits_for(pred[sl]), torch.from_numpy(truth[sl]).long(), groups[sl], loss=0.0)
    ours = meter.compute()["dice_fg"]

    metric = DiceMetric(include_background=False, reduction="mean")
    for case in "abc":
        idx = [i for i, g in enumerate(groups) if g == case]
        # A case as one volume: (1, C, D, H, W) one-hot.
        to_volume = lambda a, idx=idx: (
            torch.nn.functional.one_hot(torch.from_numpy(a[idx]).long(), 2).permute(3, 0, 1, 2)[None].float()
        )  # noqa: E731
        metric(y_pred=to_volume(pred), y=to_volume(truth))
    assert ours == pytest.approx(metric.aggregate().item(), abs=1e-6)


def test_soft_dice_loss_near_zero_for_confident_correct_prediction():
    truth = torch.from_numpy(np.array([[[1, 1], [0, 0]]])).long()
    logits = logits_for(truth.numpy()) * 10
    assert soft_dice_loss(logits, truth).item() == pytest.approx(0.0, abs=1e-4)
    wrong = logits_for(1 - truth.numpy()) * 10
    assert soft_dice_loss(wrong, truth).item() == pytest.approx(1.0, abs=1e-4)
    assert dice_ce_loss(logits, truth).item() < dice_ce_loss(wrong, truth).item()


def test_nested_region_dice_for_three_classes_only():
    import torch

    from fedmedbench.metrics import SegmentationMeter

    target = torch.tensor([[[0, 1, 1, 2]], [[0, 0, 1, 1]]])  # 2 samples, 1 x 4 pixels
    pred = torch.tensor([[[0, 1, 2, 2]], [[0, 1, 1, 0]]])
    logits = torch.nn.functional.one_hot(pred, 3).permute(0, 3, 1, 2).float()
    meter = SegmentationMeter(3)
    meter.update(logits, target, ["a", "b"], 0.0)
    scores = meter.compute()
    # disc (label >= 1): sample 1 |P|=3 |G|=3 inter 3 -> 1; sample 2 |P|=2 |G|=2 inter 1 -> 0.5
    assert scores["dice_region1"] == pytest.approx(0.75)
    # cup (label >= 2): sample 1 |P|=2 |G|=1 inter 1 -> 2/3; sample 2 has no cup in the truth: left out
    assert scores["dice_region2"] == pytest.approx(2 / 3)
    assert scores["dice_regions"] == pytest.approx((0.75 + 2 / 3) / 2)
    binary = SegmentationMeter(2)
    binary.update(
        torch.nn.functional.one_hot(target.clamp(max=1), 2).permute(0, 3, 1, 2).float(),
        target.clamp(max=1),
        ["a", "b"],
        0.0,
    )
    assert set(binary.compute()) == {"dice_paper", "dice_fg", "loss"}
