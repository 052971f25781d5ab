"""Base client: local training with hooks. Methods subclass it and override a few hooks.

Hooks: ``receive(package)``, ``loss(x, y)``, ``after_backward()``, ``train_step(x, y)``, ``reply()``,
``eval_model()``, ``state_dict()/load_state_dict()``. The base behaviour is FedAvg's client.
"""

from __future__ import annotations

import torch
from torch import nn

from fedmedbench.fl.data import ClientSplits, train_batches
from fedmedbench.losses import build_loss
from fedmedbench.ops.aggregate import batchnorm_keys, buffer_keys


def build_optimizer(params, cfg: dict) -> torch.optim.Optimizer:
    name = cfg["name"]
    if name == "adam":
        return torch.optim.Adam(params, lr=cfg["lr"], betas=tuple(cfg.get("betas", (0.9, 0.999))), weight_decay=cfg.get("weight_decay", 0.0))
    if name == "sgd":
        return torch.optim.SGD(params, lr=cfg["lr"], momentum=cfg.get("momentum", 0.0), weight_decay=cfg.get("weight_decay", 0.0))
    raise ValueError(f"unknown optimizer {name!r} (known: adam, sgd)")


class Client:
    def __init__(self, cfg: dict, index: int, data: ClientSplits, model: nn.Module, generator: torch.Generator, device: torch.device):
        self.cfg, self.index, self.data, self.name = cfg, index, data, data.name
        self.params = cfg.get("method_params", {})
        self.model = model.to(device)
        self.device = device
        self.generator = generator
        self.task_loss = build_loss(cfg["loss"])
        self.optimizer = build_optimizer(self.model.parameters(), cfg["optimizer"])
        self.local_keys = self.declare_local_keys()
        self.steps = 0  # optimizer steps in the current round (FedNova's tau)

    # --- key policy -------------------------------------------------------------------------
    def declare_local_keys(self) -> set[str]:
        """State-dict keys that never leave the client. FedAvg: none, or the BN running statistics
        when ``aggregation.bn_buffers = local``."""
        if self.cfg["aggregation"].get("bn_buffers", "average") == "local":
            return buffer_keys(self.model) & batchnorm_keys(self.model)
        return set()

    # --- hooks ------------------------------------------------------------------------------
    def receive(self, package: dict | None) -> None:
        """Load the shared part of the server's package (``None``: nothing sent, e.g. Solo)."""
        if package is None:
            return
        shared = {k: v for k, v in package["state"].items() if k not in self.local_keys}
        self.model.load_state_dict(shared, strict=False)
        if self.cfg.get("reset_optimizer_each_round", False):
            self.optimizer = build_optimizer(self.model.parameters(), self.cfg["optimizer"])

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.task_loss(self.model(x), y)

    def after_backward(self) -> None:
        """Called between ``backward()`` and ``optimizer.step()`` (gradient corrections go here)."""

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """One optimizer step. Methods with a different step (e.g. weight perturbation) override it."""
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.loss(x, y)
        loss.backward()
        self.after_backward()
        self.optimizer.step()
        return loss.detach()

    def train(self, epochs: int) -> float:
        self.model.train()
        self.steps, loss_sum = 0, 0.0
        for _ in range(epochs):
            for x, y in train_batches(self.data.train, self.cfg["batch_size"], self.generator, self.cfg.get("augment", "none"), self.cfg.get("intensity_scale", 1.0)):
                loss_sum += self.train_step(x.to(self.device), y.to(self.device)).item()
                self.steps += 1
        return loss_sum / max(self.steps, 1)

    def reply(self) -> dict:
        """What goes up to the server: the model, the sample count and the number of local steps."""
        state = {k: v for k, v in self.model.state_dict().items() if k not in self.local_keys}
        return {"state": state, "num_samples": len(self.data.train), "steps": self.steps}

    def eval_model(self) -> nn.Module:
        return self.model

    # --- checkpointing ------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(), "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.generator.set_state(state["generator"])
