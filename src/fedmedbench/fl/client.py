"""Base client: local training with hooks. Methods subclass it and override a few hooks.

Hooks: ``receive(package)``, ``before_epoch(epoch)``, ``loss(x, y)``, ``after_backward()``,
``train_step(x, y)``, ``reply()``, ``answer(query)`` (a server's second question in a round, e.g.
"evaluate this model on your validation data"), ``eval_model()``, ``state_dict()/load_state_dict()``.
A method may hold more models than ``self.model`` (a deputy, a personal model, a meme model): it
creates them in ``__init__``, trains them in ``train_step``, checkpoints them in ``state_dict``.
``self.model`` is the one whose weights go up in ``reply`` by default and are checked for divergence.
The base behaviour is FedAvg's client.

The package (and a query) a client receives is its own copy, in either runtime: editing it in place
changes nothing the server or another client holds. What ``reply`` returns is copied on its way up,
so the server's edits never reach the client's models (fl/rounds.py ``own_copy``).
"""

from __future__ import annotations

import torch
from torch import nn

from fedmedbench import faults
from fedmedbench.errors import ConfigError
from fedmedbench.fl import checkpoint
from fedmedbench.fl.data import ClientSplits, train_batches
from fedmedbench.losses import build_loss
from fedmedbench.ops.aggregate import batchnorm_keys, buffer_keys
from fedmedbench.runconfig import OptimizerConfig, RunConfig


def build_optimizer(params, cfg: OptimizerConfig) -> torch.optim.Optimizer:
    if cfg.name == "adam":
        return torch.optim.Adam(params, lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay)
    if cfg.name == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    raise ConfigError(f"optimizer.name: unknown optimizer {cfg.name!r} (known: adam, sgd)")


def autocast(device: torch.device, precision: str):
    """``precision: bf16``: autocast to bfloat16 (no loss scaling needed); ``fp32``: a no-op context."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")


def batch_to_device(batch: torch.Tensor, device: torch.device, precision: str) -> torch.Tensor:
    """bf16 runs use channels_last, where cuDNN's fast bf16 convolution kernels live; fp32 batches
    keep their layout (results stay bit-identical to earlier releases)."""
    if precision == "bf16" and batch.dim() == 4:
        return batch.to(device, memory_format=torch.channels_last)
    return batch.to(device)


def wrong_shape(state: dict[str, torch.Tensor], model: nn.Module) -> None:
    """A ``ValueError`` naming the first tensor of a received ``state`` whose shape is not the model's."""
    own = model.state_dict()
    for key, value in state.items():
        if key in own and tuple(value.shape) != tuple(own[key].shape):
            raise ValueError(
                f"the package's tensor {key!r} has shape {list(value.shape)}, the model's has {list(own[key].shape)} (the server's aggregate or package made it so)"
            )


class Client:
    def __init__(
        self,
        cfg: RunConfig,
        index: int,
        data: ClientSplits,
        model: nn.Module,
        generator: torch.Generator,
        device: torch.device,
    ):
        self.cfg, self.index, self.data, self.name = cfg, index, data, data.name
        self.params = cfg.method_params
        self.model = (
            model.to(device, memory_format=torch.channels_last) if cfg.precision == "bf16" else model.to(device)
        )
        self.device = device
        self.generator = generator
        self.task_loss = build_loss(cfg.loss)
        self.optimizer = build_optimizer(self.model.parameters(), cfg.optimizer)
        self.local_keys = self.declare_local_keys()
        self.steps = 0  # optimizer steps in the current round (FedNova's tau)
        self.round_index = 0  # set by the engine before each round's training
        self.epoch_probe = None  # engine callback after each local epoch (local-epoch curves)

    # --- key policy -------------------------------------------------------------------------
    def declare_local_keys(self) -> set[str]:
        """State-dict keys that never leave the client. FedAvg: none, or the BN running statistics
        when ``aggregation.bn_buffers = local``."""
        if self.cfg.aggregation.bn_buffers == "local":
            return buffer_keys(self.model) & batchnorm_keys(self.model)
        return set()

    # --- hooks ------------------------------------------------------------------------------
    def receive(self, package: dict | None) -> None:
        """Load the shared part of the server's package (``None``: nothing sent, e.g. Solo)."""
        if package is None:
            return
        shared = {k: v for k, v in package["state"].items() if k not in self.local_keys}
        try:
            self.model.load_state_dict(shared, strict=False)
        except RuntimeError:
            wrong_shape(shared, self.model)  # torch's own message says "from checkpoint"; name the package's tensor
            raise
        if self.cfg.reset_optimizer_each_round:
            self.optimizer = build_optimizer(self.model.parameters(), self.cfg.optimizer)

    def before_epoch(self, epoch: int) -> None:
        """Called before each local epoch (0-based within the round), e.g. to pick a training stage."""

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
        """Local training; returns the mean training loss. The loss is summed on the device in float64
        (the same sum as Python floats, in the same order) and read once, not once per step."""
        self.model.train()
        self.set_learning_rate()
        self.steps = 0
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        for epoch in range(epochs):
            self.before_epoch(epoch)
            for x, y in train_batches(
                self.data.train,
                self.cfg.batch_size,
                self.generator,
                self.cfg.augment,
                self.cfg.intensity_scale,
                self.device,
                self.cfg.drop_last,
            ):
                faults.reached("train_step")
                # Every method's step (HarmoFL's perturbed step, MOON's extra forwards, two-model
                # steps) runs under the run's precision.
                with autocast(self.device, self.cfg.precision):
                    loss = self.train_step(batch_to_device(x, self.device, self.cfg.precision), y.to(self.device))
                loss_sum += loss.double()
                self.steps += 1
            if self.epoch_probe is not None:
                self.epoch_probe(self, epoch + 1)
        return float(loss_sum) / max(self.steps, 1)

    def optimizers(self) -> list[torch.optim.Optimizer]:
        """Every optimizer this client steps (a method with two models has two)."""
        return [self.optimizer]

    def set_learning_rate(self) -> None:
        """Step decay by round: lr x factor^floor((round - 1) / every), when ``optimizer.lr_decay_every_rounds`` > 0."""
        opt = self.cfg.optimizer
        if opt.lr_decay_every_rounds and self.round_index >= 1:
            lr = opt.lr * opt.lr_decay_factor ** ((self.round_index - 1) // opt.lr_decay_every_rounds)
            for optimizer in self.optimizers():
                for group in optimizer.param_groups:
                    group["lr"] = lr

    def reply(self) -> dict:
        """What goes up to the server: the model, the sample count and the number of local steps."""
        state = {k: v for k, v in self.model.state_dict().items() if k not in self.local_keys}
        return {"state": state, "num_samples": len(self.data.train), "steps": self.steps}

    def answer(self, query):
        """Reply to the server's ``query`` (see ``Server.query``); the base client is never asked."""
        raise NotImplementedError(f"{type(self).__module__}: the server sent a query but the client has no answer()")

    def eval_model(self) -> nn.Module:
        return self.model

    # --- checkpointing ------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "generator": self.generator.get_state(),
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore from a checkpoint loaded on the CPU, whatever device this client trains on.
        Model and optimizer state are copied/cast to the parameters' device by torch; the data
        generator is a CPU generator and keeps its CPU state; every other entry (a method's own
        tensors: FedProx's anchor, HarmoFL's amplitudes, ...) is moved to this client's device here,
        in place, before the subclass reads it, so no method has to remember to."""
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.generator.set_state(state["generator"])
        for key in set(state) - {"model", "optimizer", "generator"}:
            state[key] = checkpoint.to_device(state[key], self.device)
