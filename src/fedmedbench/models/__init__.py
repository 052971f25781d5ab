"""Model factory: ``build_model(cfg.model)`` from a run config's model section."""

from __future__ import annotations

from torch import nn

from fedmedbench.errors import ConfigError
from fedmedbench.models.unet import UNet
from fedmedbench.models.vgg import VGGSlim, vgg16_bn_128
from fedmedbench.runconfig import ModelConfig


def build_model(cfg: ModelConfig | dict) -> nn.Module:
    cfg = ModelConfig.from_dict(cfg, "model")
    if cfg.name == "unet":
        return UNet(
            in_channels=cfg.in_channels, num_classes=cfg.num_classes, init_features=cfg.init_features, bn=cfg.bn
        )
    if cfg.name == "densenet":
        from fedmedbench.models.densenet import DenseNet121  # noqa: PLC0415  (DenseNet pulls in torchvision, ~1.3 s after torch, which a UNet job never needs)

        return DenseNet121(
            num_classes=cfg.num_classes,
            in_channels=cfg.in_channels,
            bn=cfg.bn,
            growth_rate=cfg.growth_rate,
            block_config=tuple(cfg.block_config),
            num_init_features=cfg.num_init_features,
        )
    if cfg.name == "vgg16_bn":
        return vgg16_bn_128(num_classes=cfg.num_classes, in_channels=cfg.in_channels)
    if cfg.name == "vgg_slim":
        return VGGSlim(num_classes=cfg.num_classes, in_channels=cfg.in_channels, width=cfg.init_features)
    raise ConfigError(f"model.name: unknown model {cfg.name!r} (known: unet, densenet, vgg16_bn, vgg_slim)")
