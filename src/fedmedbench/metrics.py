"""Evaluation metrics.

Two Dice definitions are reported side by side (docs/decisions.md):
- ``dice_paper``: as the papers' code computes it: argmax prediction, Dice per sample and per class
  *including background*, a class absent from both prediction and truth scoring 0, averaged over
  classes and then over samples. Comparable to the published tables, inflated by the background.
- ``dice_fg``: per-case foreground Dice: all of a case's slices in the split pooled into one volume,
  Dice of the foreground class(es), averaged over cases. Equals MONAI's
  ``DiceMetric(include_background=False)`` on those volumes (tests/test_metrics.py checks it).
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import torch
import torch.nn.functional as F

EPS = 1e-8

METRIC_DESCRIPTIONS = {
    "dice_paper": "Dice as in the papers' code: argmax, per sample and class incl. background, mean over classes then samples",
    "dice_fg": "per-case foreground Dice: a case's slices pooled, background excluded, mean over cases (= MONAI DiceMetric)",
    "accuracy": "top-1 accuracy",
    "loss": "task loss",
    "dice_regions": "mean over k >= 1 of dice_region<k> (fundus: mean of optic disc and cup Dice)",
}
# Nested regions of an ordered label map with >= 3 classes: region k = {label >= k} (fundus: region 1 =
# optic disc = rim + cup, region 2 = cup, the DoFE/FedDG convention). Binary tasks get none.
METRIC_DESCRIPTIONS.update(
    {
        f"dice_region{k}": f"per-sample Dice of the region label >= {k} (fundus: {name}), samples without it in the truth left out, mean over samples"
        for k, name in ((1, "optic disc"), (2, "optic cup"), *((k, f"region {k}") for k in range(3, 10)))
    }
)


def per_class_counts(pred: torch.Tensor, target: torch.Tensor, num_classes: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per sample and class: |P & G|, |P|, |G| (each B x C)."""
    pred_1h = F.one_hot(pred, num_classes).flatten(1, 2)
    target_1h = F.one_hot(target, num_classes).flatten(1, 2)
    intersection = (pred_1h * target_1h).sum(1)
    return intersection, pred_1h.sum(1), target_1h.sum(1)


def dice_paper_per_sample(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    inter, p, g = per_class_counts(logits.argmax(1), target, logits.shape[1])
    dice = 2 * inter.double() / (p + g).double().clamp_min(EPS)
    return dice.mean(dim=1)


def region_dice_per_sample(pred: torch.Tensor, target: torch.Tensor, num_classes: int) -> torch.Tensor:
    """B x (C-1) Dice of the nested regions {label >= k}, k = 1..C-1 (NaN where the truth lacks the region)."""
    out = []
    for k in range(1, num_classes):
        p, g = (pred >= k).flatten(1), (target >= k).flatten(1)
        inter, size_p, size_g = (p & g).sum(1).double(), p.sum(1).double(), g.sum(1).double()
        dice = 2 * inter / (size_p + size_g).clamp_min(EPS)
        out.append(torch.where(size_g > 0, dice, torch.full_like(dice, float("nan"))))
    return torch.stack(out, dim=1)


class SegmentationMeter:
    """Accumulates both Dice definitions and the loss over a split, batch by batch (and, with >= 3
    classes, the Dice of the nested regions {label >= k}: fundus optic disc and cup)."""

    def __init__(self, num_classes: int):
        self.num_classes = num_classes
        self.regions: list[torch.Tensor] = []
        self.dice_paper: list[float] = []
        self.loss_sum, self.count = 0.0, 0
        self.cases = defaultdict(lambda: np.zeros((3, num_classes - 1)))  # inter, |P|, |G| per fg class

    def update(self, logits: torch.Tensor, target: torch.Tensor, groups, loss: float) -> None:
        self.dice_paper.extend(dice_paper_per_sample(logits, target).tolist())
        if self.num_classes >= 3:
            self.regions.append(region_dice_per_sample(logits.argmax(1), target, self.num_classes).cpu())
        self.loss_sum += loss * len(target)
        self.count += len(target)
        inter, p, g = (t[:, 1:].cpu().numpy() for t in per_class_counts(logits.argmax(1), target, self.num_classes))
        for i, group in enumerate(groups):
            self.cases[group] += np.stack([inter[i], p[i], g[i]])

    def compute(self) -> dict[str, float]:
        case_dice = []
        for inter, p, g in self.cases.values():
            # As MONAI (ignore_empty=True): a class absent from the case's truth is left out.
            dice = np.where(g > 0, 2 * inter / np.maximum(p + g, EPS), np.nan)
            if not np.isnan(dice).all():
                case_dice.append(np.nanmean(dice))
        scores = {
            "dice_paper": float(np.mean(self.dice_paper)),
            "dice_fg": float(np.mean(case_dice)) if case_dice else float("nan"),
            "loss": self.loss_sum / max(self.count, 1),
        }
        if self.regions:
            regions = torch.cat(self.regions).numpy()
            per_region = [float(np.nanmean(col)) if not np.isnan(col).all() else float("nan") for col in regions.T]
            scores.update({f"dice_region{k + 1}": v for k, v in enumerate(per_region)})
            scores["dice_regions"] = float(np.mean(per_region))
        return scores


class ClassificationMeter:
    def __init__(self, num_classes: int):
        self.correct, self.count, self.loss_sum = 0, 0, 0.0

    def update(self, logits: torch.Tensor, target: torch.Tensor, groups, loss: float) -> None:
        self.correct += int((logits.argmax(1) == target).sum())
        self.count += len(target)
        self.loss_sum += loss * len(target)

    def compute(self) -> dict[str, float]:
        return {"accuracy": self.correct / max(self.count, 1), "loss": self.loss_sum / max(self.count, 1)}


METERS = {"segmentation": SegmentationMeter, "classification": ClassificationMeter}
