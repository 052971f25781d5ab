"""Evaluation metrics.

Two Dice definitions are reported side by side (docs/reviewers/index.md):
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
    "f1_macro": "macro F1 over the classes present in truth or prediction (scikit-learn f1_score(average='macro'), as PRR-FL's code)",
    "auc_macro": "macro one-vs-rest ROC AUC of the softmax probabilities (scikit-learn roc_auc_score(multi_class='ovr'); a class absent from the truth is left out)",
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


def per_class_counts(
    pred: torch.Tensor, target: torch.Tensor, num_classes: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per sample and class: |P & G|, |P|, |G| (each B x C)."""
    pred_1h = F.one_hot(pred, num_classes).flatten(1, 2)
    target_1h = F.one_hot(target, num_classes).flatten(1, 2)
    intersection = (pred_1h * target_1h).sum(1)
    return intersection, pred_1h.sum(1), target_1h.sum(1)


def dice_paper_per_sample(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return dice_paper_from_counts(*per_class_counts(logits.argmax(1), target, logits.shape[1]))


def dice_paper_from_counts(inter: torch.Tensor, p: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """Per sample: the mean over classes (background included) of 2 |P & G| / (|P| + |G|)."""
    dice = 2 * inter.double() / (p + g).double().clamp_min(EPS)
    return dice.mean(dim=1)


def degenerate_flags(
    kind: str, samples: int, predicted: np.ndarray, truth: np.ndarray, split: str = "test"
) -> dict[str, str]:
    """What makes a split's scores no measure of a model, from the per-class counts of its argmax
    predictions and of the truth (pixels for segmentation, samples for classification):
    ``collapsed``: one class predicted everywhere (every pixel of every image; every sample, with at
    least two); ``no_foreground`` (segmentation): no truth pixel of any class but 0, so foreground
    Dice is undefined and Dice incl. background scores only the background. {} when neither."""
    flags = {}
    used = np.flatnonzero(predicted)
    if kind == "segmentation":
        if samples and len(used) == 1:
            c = int(used[0])
            flags["collapsed"] = (
                f"predicts class {c}{' (background)' if c == 0 else ''} on every pixel of all {samples} {split} images"
            )
        if samples and not truth[1:].any():
            flags["no_foreground"] = f"no foreground pixel in any of its {samples} {split} images"
    elif samples >= 2 and len(used) == 1:
        flags["collapsed"] = f"predicts class {int(used[0])} for all {samples} {split} samples"
    return flags


def cohort_flag_texts(flags: dict) -> dict[str, str]:
    """A cohort's ``flags`` (``fl.evaluation.score_cohort``) as final.json's ``flags`` entry of the cohort:
    {kind: which of its scores (the ensemble, each client's model) and why}."""
    parts: dict[str, list[str]] = {}
    found = [("the ensemble", (flags.get("ensemble") or {}))] + [
        (f"client {c}'s model", f) for c, f in (flags.get("per_model") or {}).items()
    ]
    for who, kinds in found:
        for kind, why in kinds.items():
            # no foreground is the split's, whichever model scored it: said once
            text = why if kind == "no_foreground" else f"{who} {why}"
            if text not in parts.setdefault(kind, []):
                parts[kind].append(text)
    return {kind: "; ".join(texts) for kind, texts in parts.items()}


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
        # Pixels per class over the split, predicted and true: what ``flags`` judges a model by.
        self.predicted = np.zeros(num_classes, np.int64)
        self.truth = np.zeros(num_classes, np.int64)

    def update(self, logits: torch.Tensor, target: torch.Tensor, groups, loss: float) -> None:
        pred = logits.argmax(1)
        counts = per_class_counts(pred, target, self.num_classes)  # once, for both Dice and the flags
        self.dice_paper.extend(dice_paper_from_counts(*counts).tolist())
        if self.num_classes >= 3:
            self.regions.append(region_dice_per_sample(pred, target, self.num_classes).cpu())
        self.loss_sum += loss * len(target)
        self.count += len(target)
        inter, p, g = (t.cpu().numpy() for t in counts)
        self.predicted += p.sum(0)
        self.truth += g.sum(0)
        inter, p, g = inter[:, 1:], p[:, 1:], g[:, 1:]
        for i, group in enumerate(groups):
            self.cases[group] += np.stack([inter[i], p[i], g[i]])

    def class_counts(self) -> dict:
        """Images, and pixels per class predicted (argmax) and true, over the split so far."""
        return {"samples": self.count, "predicted": self.predicted.tolist(), "truth": self.truth.tolist()}

    def flags(self, split: str = "test") -> dict[str, str]:
        return degenerate_flags("segmentation", self.count, self.predicted, self.truth, split)

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


def binary_auc(positive: np.ndarray, score: np.ndarray) -> float:
    """ROC AUC by the rank-sum (Mann-Whitney U) formula, ties counted one half: the same number as
    scikit-learn's ``roc_auc_score`` (tests check it), without its import and validation cost."""
    order = np.argsort(score, kind="mergesort")
    _, inverse, counts = np.unique(score[order], return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)
    ranks = np.empty(len(score))
    ranks[order] = ((ends - counts + 1 + ends) / 2.0)[inverse]  # average 1-based rank of each tie group
    n_pos = int(positive.sum())
    n_neg = len(positive) - n_pos
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def macro_auc_ovr(target: np.ndarray, probs: np.ndarray) -> float:
    """Mean over classes of the binary ROC AUC of class c vs the rest: scikit-learn's
    ``roc_auc_score(target, probs, multi_class="ovr", average="macro")`` (binary: the AUC of class 1),
    except that a class absent from ``target`` (or the only class present) is left out instead of
    raising; NaN when no class can be scored."""
    if probs.shape[1] == 2:
        return binary_auc(target == 1, probs[:, 1]) if len(np.unique(target)) == 2 else float("nan")
    scores = [
        binary_auc(target == c, probs[:, c]) for c in range(probs.shape[1]) if 0 < (target == c).sum() < len(target)
    ]
    return float(np.mean(scores)) if scores else float("nan")


def macro_f1(target: np.ndarray, pred: np.ndarray) -> float:
    """scikit-learn's ``f1_score(target, pred, average="macro", zero_division=0)``: the mean over the
    labels present in the truth or the prediction of 2 TP / (2 TP + FP + FN)."""
    scores = []
    for label in np.union1d(target, pred):
        tp = int(((pred == label) & (target == label)).sum())
        wrong = int((pred != target)[(pred == label) | (target == label)].sum())
        scores.append(2 * tp / (2 * tp + wrong) if tp + wrong else 0.0)
    return float(np.mean(scores)) if scores else 0.0


class ClassificationMeter:
    """Accuracy and loss, plus PRR-FL's macro F1 and macro one-vs-rest AUC (from the softmax
    probabilities, kept on the host for the whole split)."""

    def __init__(self, num_classes: int):
        self.correct, self.count, self.loss_sum = 0, 0, 0.0
        self.targets: list[np.ndarray] = []
        self.probs: list[np.ndarray] = []
        self.predicted = np.zeros(num_classes, np.int64)  # samples per predicted (argmax) class

    def update(self, logits: torch.Tensor, target: torch.Tensor, groups, loss: float) -> None:
        pred = logits.argmax(1)
        self.correct += int((pred == target).sum())
        self.predicted += np.bincount(pred.cpu().numpy(), minlength=len(self.predicted))
        self.count += len(target)
        self.loss_sum += loss * len(target)
        self.targets.append(target.cpu().numpy())
        self.probs.append(torch.softmax(logits.float(), dim=1).cpu().numpy())

    def compute(self) -> dict[str, float]:
        scores = {"accuracy": self.correct / max(self.count, 1), "loss": self.loss_sum / max(self.count, 1)}
        if self.count:
            target, probs = np.concatenate(self.targets), np.concatenate(self.probs)
            scores["f1_macro"] = macro_f1(target, probs.argmax(1))
            scores["auc_macro"] = macro_auc_ovr(target, probs)
        return scores

    def truth(self) -> np.ndarray:
        targets = np.concatenate(self.targets) if self.targets else np.zeros(0, np.int64)
        return np.bincount(targets, minlength=len(self.predicted))

    def class_counts(self) -> dict:
        """Samples, and samples per class predicted (argmax) and true, over the split so far."""
        return {"samples": self.count, "predicted": self.predicted.tolist(), "truth": self.truth().tolist()}

    def flags(self, split: str = "test") -> dict[str, str]:
        return degenerate_flags("classification", self.count, self.predicted, self.truth(), split)


METERS = {"segmentation": SegmentationMeter, "classification": ClassificationMeter}
