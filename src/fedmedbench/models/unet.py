"""2D UNet as used by HarmoFL for prostate MRI (mateuszbuda-style).

Encoder widths f, 2f, 4f, 8f and a 16f bottleneck (f = ``init_features``, 32 in the paper: 32-512),
each block (3x3 conv without bias, BN, ReLU) x 2, transposed-conv upsampling and a 1x1 output conv.
``init_features`` is configurable so the demo can train a tiny network on the CPU.
"""

from __future__ import annotations

import torch
from torch import nn

from fedmedbench.models.norm import make_batchnorm


def _block(in_ch: int, out_ch: int, bn: str) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(in_ch, out_ch, kernel_size=3, padding=1, bias=False),
        make_batchnorm(out_ch, bn),
        nn.ReLU(inplace=True),
        nn.Conv2d(out_ch, out_ch, kernel_size=3, padding=1, bias=False),
        make_batchnorm(out_ch, bn),
        nn.ReLU(inplace=True),
    )


class UNet(nn.Module):
    def __init__(self, in_channels: int = 3, num_classes: int = 2, init_features: int = 32, bn: str = "standard"):
        super().__init__()
        f = init_features
        self.encoders = nn.ModuleList(
            [_block(in_channels, f, bn), _block(f, 2 * f, bn), _block(2 * f, 4 * f, bn), _block(4 * f, 8 * f, bn)]
        )
        self.pool = nn.MaxPool2d(kernel_size=2, stride=2)
        self.bottleneck = _block(8 * f, 16 * f, bn)
        widths = [16 * f, 8 * f, 4 * f, 2 * f, f]
        self.upconvs = nn.ModuleList(
            nn.ConvTranspose2d(widths[i], widths[i + 1], kernel_size=2, stride=2) for i in range(4)
        )
        self.decoders = nn.ModuleList(_block(2 * widths[i + 1], widths[i + 1], bn) for i in range(4))
        self.head = nn.Conv2d(f, num_classes, kernel_size=1)
        self.feature_dim = 16 * f

    def encode(self, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        skips = []
        for encoder in self.encoders:
            x = encoder(x)
            skips.append(x)
            x = self.pool(x)
        return self.bottleneck(x), skips

    def decode(self, x: torch.Tensor, skips: list[torch.Tensor]) -> torch.Tensor:
        for upconv, decoder, skip in zip(self.upconvs, self.decoders, reversed(skips)):
            x = decoder(torch.cat([upconv(x), skip], dim=1))
        return self.head(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bottleneck, skips = self.encode(x)
        return self.decode(bottleneck, skips)

    def forward_with_embedding(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits and pooled bottleneck features from one pass (MOON needs both)."""
        bottleneck, skips = self.encode(x)
        return self.decode(bottleneck, skips), bottleneck.mean(dim=(2, 3))

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """Global-average-pooled bottleneck features (B x feature_dim), e.g. for MOON's projection head."""
        return self.encode(x)[0].mean(dim=(2, 3))
