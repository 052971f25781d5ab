"""DenseNet-121 (torchvision, no pretraining) adapted to 96x96 Camelyon17 patches as HarmoFL's code does.

torchvision's ``densenet121(weights=None)`` (growth 32, blocks 6-12-24-16, 64 stem features, bn_size 4,
no dropout, Kaiming-normal convolutions, zero linear bias: the same topology and initialisation as
HarmoFL's ``nets/models.py``), with HarmoFL's one change for the small input: a ``ZeroPad2d(2)`` after
the first dense block (24x24 -> 28x28 feature maps at 96 px input; the final map is 3x3 either way).
The classifier has ``num_classes`` (2) outputs.

``bn="standard"``: torchvision's BN (affine, running statistics). ``bn="stateless"``: every BN without
affine parameters and running statistics, as in HarmoFL's code (batch statistics at test time too).
"""

from __future__ import annotations

from collections import OrderedDict

import torch
import torch.nn.functional as F
import torchvision
from torch import nn

from fedmedbench.models.norm import BN_KINDS, make_batchnorm


def _replace_batchnorm(module: nn.Module, kind: str) -> None:
    for name, child in module.named_children():
        if isinstance(child, nn.BatchNorm2d):
            setattr(module, name, make_batchnorm(child.num_features, kind))
        else:
            _replace_batchnorm(child, kind)


class DenseNet121(nn.Module):
    def __init__(
        self,
        num_classes: int = 2,
        in_channels: int = 3,
        bn: str = "standard",
        pad_after_block1: int = 2,
        growth_rate: int = 32,
        block_config: tuple[int, ...] = (6, 12, 24, 16),
        num_init_features: int = 64,
    ):
        """The defaults are DenseNet-121; smaller ``growth_rate``/``block_config`` give the demo's slim net."""
        super().__init__()
        if bn not in BN_KINDS:
            raise ValueError(f"unknown batch-norm kind {bn!r}; expected one of {BN_KINDS}")
        base = torchvision.models.DenseNet(
            growth_rate=growth_rate,
            block_config=tuple(block_config),
            num_init_features=num_init_features,
            num_classes=num_classes,
        )
        layers = OrderedDict()
        for name, layer in base.features.named_children():
            if name == "conv0" and in_channels != 3:
                layer = nn.Conv2d(in_channels, layer.out_channels, kernel_size=7, stride=2, padding=3, bias=False)
                nn.init.kaiming_normal_(layer.weight)
            layers[name] = layer
            if name == "denseblock1" and pad_after_block1:
                layers["zero_padding"] = nn.ZeroPad2d(pad_after_block1)
        self.features = nn.Sequential(layers)
        self.classifier = base.classifier
        self.feature_dim = base.classifier.in_features  # 1024
        if bn != "standard":
            _replace_batchnorm(self, bn)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """Global-average-pooled features after the final BN + ReLU (B x 1024), e.g. for MOON's head."""
        return torch.flatten(F.adaptive_avg_pool2d(F.relu(self.features(x)), (1, 1)), 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.embed(x))
