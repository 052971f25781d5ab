"""Ditto (Li, Hu, Beirami, Smith, ICML 2021): a personal model per client, pulled towards the global one.

Per minibatch (as the reference ditto.py): one step of the personal model v_k on
F_k(v) + λ/2 ||v - w^t||² (its gradient gets λ (v - w^t); the anchor is the **received** w^t, not the
updated global copy), then one ordinary FedAvg step of the global copy on the same batch. Only the
global copy goes up; the server is FedAvg. Each client is evaluated with its personal model
(``PERSONALIZED``). v_k starts at the common initialisation w^0 and has its own optimizer (same
settings, persistent state), listed in ``optimizers()`` so the lr schedule reaches it.

λ = 0: v_k follows Solo exactly (same batches, same optimizer) and the global trajectory is exactly
FedAvg's (personal steps draw no random numbers); tests check both. Default λ = 1 (the reference's
``run_*_lam1.sh`` and NVFlare's prostate ``ditto_lambda``).
"""

from __future__ import annotations

import copy

import torch

from fedmedbench.fl import client
from fedmedbench.fl.client import build_optimizer
from fedmedbench.fl.server import Server

DEFAULTS = {"lam": 1.0}
# Ranges and choices of the parameters (their types come from DEFAULTS): checked at DAG time.
PARAM_SCHEMA = {"lam": {"type": "number", "minimum": 0}}
PERSONALIZED = True


class Client(client.Client):
    def __init__(self, cfg, index, data, model, generator, device):
        super().__init__(cfg, index, data, model, generator, device)
        self.personal = copy.deepcopy(self.model)  # w^0
        self.personal_optimizer = build_optimizer(self.personal.parameters(), cfg.optimizer)
        self.anchor = [p.detach().clone() for p in self.model.parameters()]

    def receive(self, package):
        super().receive(package)
        if package is None:
            return
        self.anchor = [p.detach().clone() for p in self.model.parameters()]
        if self.cfg.reset_optimizer_each_round:
            self.personal_optimizer = build_optimizer(self.personal.parameters(), self.cfg.optimizer)

    def optimizers(self):
        return [self.optimizer, self.personal_optimizer]

    def train_step(self, x, y):
        self.personal.train()
        self.personal_optimizer.zero_grad(set_to_none=True)
        self.task_loss(self.personal(x), y).backward()
        lam = self.params["lam"]
        if lam:
            with torch.no_grad():
                for param, anchor in zip(self.personal.parameters(), self.anchor):
                    if param.grad is not None:
                        param.grad.add_(param - anchor, alpha=lam)
        self.personal_optimizer.step()
        return super().train_step(x, y)  # the global copy: a plain FedAvg step

    def eval_model(self):
        return self.personal

    def state_dict(self):
        return {
            **super().state_dict(),
            "personal": self.personal.state_dict(),
            "personal_optimizer": self.personal_optimizer.state_dict(),
            "anchor": self.anchor,
        }

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.personal.load_state_dict(state["personal"])
        self.personal_optimizer.load_state_dict(state["personal_optimizer"])
        self.anchor = state["anchor"]


__all__ = ["Client", "Server", "DEFAULTS", "PERSONALIZED"]
