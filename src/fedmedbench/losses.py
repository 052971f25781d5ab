"""Task losses. ``build_loss(name)`` returns ``loss(logits, target) -> scalar``."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def soft_dice_loss(logits: torch.Tensor, target: torch.Tensor, smooth: float = 1e-5) -> torch.Tensor:
    """1 - soft Dice as in HarmoFL's code: softmax, pooled over the whole batch (not per sample),
    averaged over all classes including background."""
    probs = logits.softmax(dim=1)
    onehot = F.one_hot(target, probs.shape[1]).permute(0, 3, 1, 2).to(probs.dtype)
    dims = (0, 2, 3)
    intersection = (probs * onehot).sum(dims)
    denominator = probs.sum(dims) + onehot.sum(dims)
    dice = (2 * intersection + smooth) / (denominator + smooth)
    return 1 - dice.mean()


def dice_ce_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """HarmoFL's JointLoss for prostate: (cross-entropy + soft Dice loss) / 2."""
    return (F.cross_entropy(logits, target) + soft_dice_loss(logits, target)) / 2


LOSSES = {"dice_ce": dice_ce_loss, "dice": soft_dice_loss, "ce": F.cross_entropy}


def build_loss(name: str):
    try:
        return LOSSES[name]
    except KeyError:
        raise ValueError(f"unknown loss {name!r}; known: {sorted(LOSSES)}") from None
