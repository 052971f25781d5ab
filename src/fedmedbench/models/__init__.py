"""Model factory: ``build_model(cfg.model)`` from a run config's model section."""

from __future__ import annotations

from torch import nn

from fedmedbench.errors import ConfigError
from fedmedbench.runconfig import ModelConfig


def build_model(cfg: ModelConfig | dict) -> nn.Module:
    cfg = ModelConfig.from_dict(cfg, "model")
    if cfg.name == "unet":
        from fedmedbench.models.unet import UNet

        return UNet(in_channels=cfg.in_channels, num_classes=cfg.num_classes, init_features=cfg.init_features, bn=cfg.bn)
    if cfg.name == "densenet":
        from fedmedbench.models.densenet import DenseNet121

        return DenseNet121(
            num_classes=cfg.num_classes,
            in_channels=cfg.in_channels,
            bn=cfg.bn,
            growth_rate=cfg.growth_rate,
            block_config=tuple(cfg.block_config),
            num_init_features=cfg.num_init_features,
        )
    if cfg.name == "vgg16_bn":
        from fedmedbench.models.vgg import vgg16_bn_128

        return vgg16_bn_128(num_classes=cfg.num_classes, in_channels=cfg.in_channels)
    if cfg.name == "vgg_slim":
        from fedmedbench.models.vgg import VGGSlim

        return VGGSlim(num_classes=cfg.num_classes, in_channels=cfg.in_channels, width=cfg.init_features)
    raise ConfigError(f"model.name: unknown model {cfg.name!r} (known: unet, densenet, vgg16_bn, vgg_slim)")
