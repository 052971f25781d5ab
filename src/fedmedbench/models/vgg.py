"""PRR-FL's classifiers: VGG-16 with batch norm, as the paper names it, and the official code's slim VGG-BN.

``vgg16_bn_128``: torchvision's ``vgg16_bn`` (13 conv3x3 + BN + ReLU, 5 max-pools, no pretraining)
adapted to 128 x 128 inputs. At 128 px the feature map is 512 x 4 x 4; torchvision's
``AdaptiveAvgPool2d((7, 7))`` would blow it up to 7 x 7 by repeating pixels, so the pool is set to
``(4, 4)`` (the identity at 128 px) and the first classifier layer takes 512 * 4 * 4 = 8192 inputs;
the rest is torchvision's classifier (4096, ReLU, Dropout 0.5, 4096, ReLU, Dropout 0.5, classes).
Other image sizes work too (the pool adapts the map to 4 x 4).

``VGGSlim``: ``nets/vgg_checked.py: VGG16_Slim_Checked`` of the PRR-FL repository (the official
``vgg_nb``): 13 bias-free conv3x3, each followed by BN and ReLU, channels
[32, 32 | 64, 64 | 128, 128, 128 | 128, 128, 128 | 256, 256, 256] with a max-pool after each block,
global average pooling, ``fc1 = Linear(256, 64, no bias) + BN1d + ReLU``, ``fc2 = Linear(64, classes,
no bias)``. ``width`` scales every channel count (32: the official network; the demo uses less).
"""

from __future__ import annotations

from torch import nn

SLIM_BLOCKS = ((1, 1), (2, 2), (4, 4, 4), (4, 4, 4), (8, 8, 8))  # channels in units of width


def vgg16_bn_128(num_classes: int = 3, in_channels: int = 3) -> nn.Module:
    from torchvision.models import vgg16_bn  # noqa: PLC0415  (torchvision: ~1.3 s after torch; VGGSlim, in this module too, does not need it)

    model = vgg16_bn(weights=None, num_classes=num_classes)
    if in_channels != 3:
        first = model.features[0]
        model.features[0] = nn.Conv2d(in_channels, first.out_channels, kernel_size=3, padding=1)
    model.avgpool = nn.AdaptiveAvgPool2d((4, 4))
    old = model.classifier[0]
    model.classifier[0] = nn.Linear(512 * 4 * 4, old.out_features)
    nn.init.normal_(model.classifier[0].weight, 0, 0.01)  # torchvision's init of its linear layers
    nn.init.zeros_(model.classifier[0].bias)
    return model


class ConvBN(nn.Module):
    def __init__(self, c_in: int, c_out: int):
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, kernel_size=3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(c_out)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        return self.relu(self.bn(self.conv(x)))


class VGGSlim(nn.Module):
    def __init__(self, num_classes: int = 3, in_channels: int = 3, width: int = 32):
        super().__init__()
        blocks, c_in = [], in_channels
        for units in SLIM_BLOCKS:
            layers = []
            for unit in units:
                layers.append(ConvBN(c_in, unit * width))
                c_in = unit * width
            layers.append(nn.MaxPool2d(2))
            blocks.append(nn.Sequential(*layers))
        self.features = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        hidden = 2 * width  # 64 at width 32
        self.fc1 = nn.Sequential(nn.Linear(c_in, hidden, bias=False), nn.BatchNorm1d(hidden), nn.ReLU(inplace=True))
        self.fc2 = nn.Linear(hidden, num_classes, bias=False)

    def forward(self, x):
        return self.fc2(self.fc1(self.pool(self.features(x)).flatten(1)))
