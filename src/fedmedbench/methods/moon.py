"""MOON (Li, He, Song, CVPR 2021): model-contrastive federated learning.

Client loss per batch: l = l_task + mu * l_con with

    l_con = -log( e^{s(z, z_g)/T} / (e^{s(z, z_g)/T} + e^{s(z, z_p)/T}) )

s = cosine similarity, T = ``temperature`` (0.5), z = projection of the local model being trained,
z_g = projection of the global model received this round, z_p = projection of this client's own model
at the end of its previous round. The global and previous models are frozen copies in eval mode (as
MOON's code), one previous model (``model_buffer_size`` 1). In the first round there is no previous
model: the reference's pool is empty, l_con = 0 with zero gradient, so the term is skipped.

Design choice (the paper's networks are classifiers; HarmoFL does not say how it ran MOON on a UNet):
the representation is the network's ``embed(x)`` (UNet: global-average-pooled bottleneck; DenseNet:
pooled final features) followed by a projection head Linear(d, d) -> ReLU -> Linear(d, 256), as
MOON's ``ModelFedCon`` l1/l2. Unlike ``ModelFedCon`` the task output does not go through the head: the
head is a side branch trained only by l_con, so the segmentation/classification network is unchanged.
The head is part of what is sent and averaged (keys ``moon_head.*`` in the server's state); it is not
part of the evaluated model (``eval_model`` is the bare network, so saved models match FedAvg's keys).

With mu = 0 MOON is FedAvg bit for bit: the head is initialised from its own seed inside a forked CPU
RNG (the base network's initialisation and every later draw from the global RNG are untouched), the
head's parameters never get a gradient (Adam/SGD skip them), and no extra forward pass is run.

With mu > 0 the embedding of the trained model comes from the network's
``forward_with_embedding(x) -> (logits, features)`` if it has one (one pass); otherwise from a second
pass ``embed(x)`` in train mode (batch statistics, as the first pass) that does not update the running
statistics, so they see each batch once, as in FedAvg. Cost: up to 2 extra encoder passes of the frozen models (no grad) and one of the
trained model per batch.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedmedbench.fl import client, server
from fedmedbench.fl.client import build_optimizer
from fedmedbench.ops.perturb import frozen_norm_statistics

DEFAULTS = {"mu": 1.0, "temperature": 0.5, "projection_dim": 256}
# Ranges and choices of the parameters (their types come from DEFAULTS): checked at DAG time.
PARAM_SCHEMA = {
    "mu": {"type": "number", "minimum": 0},
    "temperature": {"type": "number", "exclusiveMinimum": 0},
    "projection_dim": {"type": "integer", "minimum": 1},
}
PERSONALIZED = False

HEAD_PREFIX = "moon_head."
_HEAD_STREAM = 0x6D6F6F6E  # "moon": the head's seed stream, distinct from the clients' (seed, index)


def contrastive_loss(z: torch.Tensor, z_global: torch.Tensor, z_prev: torch.Tensor, temperature: float) -> torch.Tensor:
    """MOON's l_con, mean over the batch: cross-entropy of [s(z, z_g), s(z, z_p)] / T with label 0."""
    positive = F.cosine_similarity(z, z_global, dim=-1)
    negative = F.cosine_similarity(z, z_prev, dim=-1)
    logits = torch.stack([positive, negative], dim=1) / temperature
    return F.cross_entropy(logits, torch.zeros(len(z), dtype=torch.long, device=z.device))


def build_head(model: nn.Module, params: dict, seed: int) -> nn.Module:
    """The projection head, initialised identically on the server and every client from (seed, "moon")
    without consuming the global RNG (the CPU generator is forked and restored; CUDA's is untouched)."""
    if not hasattr(model, "feature_dim") or not hasattr(model, "embed"):
        raise TypeError(f"MOON needs a model with `embed(x)` and `feature_dim`; {type(model).__name__} has not")
    d = model.feature_dim
    head_seed = int(np.random.SeedSequence([seed, _HEAD_STREAM]).generate_state(1)[0])
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(head_seed)
        return nn.Sequential(nn.Linear(d, d), nn.ReLU(), nn.Linear(d, params["projection_dim"]))


def _frozen(module: nn.Module) -> nn.Module:
    module = copy.deepcopy(module).eval()
    module.requires_grad_(False)
    return module


class Client(client.Client):
    def __init__(self, cfg, index, data, model, generator, device):
        super().__init__(cfg, index, data, model, generator, device)
        self.head = build_head(self.model, self.params, cfg.seed).to(device)
        self.optimizer = build_optimizer(self._trainable(), cfg.optimizer)
        self.contrastive = bool(self.params["mu"])
        if self.contrastive:
            self.global_net, self.global_head = _frozen(self.model), _frozen(self.head)
            self.prev_net, self.prev_head = _frozen(self.model), _frozen(self.head)
        self.has_prev = False

    def _trainable(self):
        return list(self.model.parameters()) + list(self.head.parameters())

    def receive(self, package):
        super().receive(package)
        if package is None:
            return
        n = len(HEAD_PREFIX)
        self.head.load_state_dict({k[n:]: v for k, v in package["state"].items() if k.startswith(HEAD_PREFIX)})
        if self.cfg.reset_optimizer_each_round:
            self.optimizer = build_optimizer(self._trainable(), self.cfg.optimizer)
        if self.contrastive:
            self.global_net.load_state_dict(self.model.state_dict())
            self.global_head.load_state_dict(self.head.state_dict())

    def _logits_and_features(self, x):
        if hasattr(self.model, "forward_with_embedding"):
            return self.model.forward_with_embedding(x)
        logits = self.model(x)
        # Batch statistics as the pass it repeats, running statistics untouched (updated once per batch).
        with frozen_norm_statistics(self.model):
            features = self.model.embed(x)
        return logits, features

    def loss(self, x, y):
        if not (self.contrastive and self.has_prev):
            return self.task_loss(self.model(x), y)
        logits, features = self._logits_and_features(x)
        z = self.head(features)
        with torch.no_grad():
            z_global = self.global_head(self.global_net.embed(x))
            z_prev = self.prev_head(self.prev_net.embed(x))
        con = contrastive_loss(z, z_global, z_prev, self.params["temperature"])
        return self.task_loss(logits, y) + self.params["mu"] * con

    def train(self, epochs):
        result = super().train(epochs)
        if self.contrastive:  # this round's local model is the next round's negative
            self.prev_net.load_state_dict(self.model.state_dict())
            self.prev_head.load_state_dict(self.head.state_dict())
            self.has_prev = True
        return result

    def reply(self):
        message = super().reply()
        message["state"] = {**message["state"], **{HEAD_PREFIX + k: v for k, v in self.head.state_dict().items()}}
        return message

    def state_dict(self):
        state = {**super().state_dict(), "head": self.head.state_dict(), "has_prev": self.has_prev}
        if self.contrastive:
            state["frozen"] = {
                name: getattr(self, name).state_dict()
                for name in ("global_net", "global_head", "prev_net", "prev_head")
            }
        return state

    def load_state_dict(self, state):
        self.head.load_state_dict(state["head"])  # before the optimizer state that refers to it
        super().load_state_dict(state)
        self.has_prev = state["has_prev"]
        for name, value in state.get("frozen", {}).items():
            getattr(self, name).load_state_dict(value)


class Server(server.Server):
    def __init__(self, cfg, model, num_clients):
        super().__init__(cfg, model, num_clients)
        head = build_head(model, self.params, cfg.seed)
        self.global_state.update({HEAD_PREFIX + k: v.detach().clone() for k, v in head.state_dict().items()})


__all__ = ["Client", "Server", "DEFAULTS", "PERSONALIZED", "contrastive_loss", "build_head"]
