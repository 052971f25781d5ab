"""Batch-norm flavours shared by the models.

``standard``: affine BN with running statistics (what torchvision and most FL baselines use).
``stateless``: no affine parameters and no running statistics, i.e. batch statistics even at test
time, which is what HarmoFL's official code does in every network (docs/reviewers/harmofl.md).
"""

from torch import nn

BN_KINDS = ("standard", "stateless")


def make_batchnorm(channels: int, kind: str) -> nn.BatchNorm2d:
    if kind == "standard":
        return nn.BatchNorm2d(channels)
    if kind == "stateless":
        return nn.BatchNorm2d(channels, affine=False, track_running_stats=False)
    raise ValueError(f"unknown batch-norm kind {kind!r}; expected one of {BN_KINDS}")
