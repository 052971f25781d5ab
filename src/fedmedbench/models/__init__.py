"""Model factory: ``build_model(cfg["model"])`` from a run config's model section."""

from __future__ import annotations

from torch import nn


def build_model(model_cfg: dict) -> nn.Module:
    name = model_cfg["name"]
    if name == "unet":
        from fedmedbench.models.unet import UNet

        return UNet(
            in_channels=model_cfg.get("in_channels", 3),
            num_classes=model_cfg.get("num_classes", 2),
            init_features=model_cfg.get("init_features", 32),
            bn=model_cfg.get("bn", "standard"),
        )
    if name == "densenet":
        from fedmedbench.models.densenet import DenseNet121

        return DenseNet121(
            num_classes=model_cfg.get("num_classes", 2),
            in_channels=model_cfg.get("in_channels", 3),
            bn=model_cfg.get("bn", "standard"),
            growth_rate=model_cfg.get("growth_rate", 32),
            block_config=tuple(model_cfg.get("block_config", (6, 12, 24, 16))),
            num_init_features=model_cfg.get("num_init_features", 64),
        )
    raise ValueError(f"unknown model {name!r} (known: unet, densenet)")
