"""q-FedAvg (Li, Sanjabi, Beirami, Smith, ICLR 2020 "Fair Resource Allocation in FL").

Client k, round t: F_k = its task loss of the received w^t on its **whole train split**, before
training, in eval mode (+1e-10 as the reference code), then ordinary local training to w̄_k.
Server, on trainable parameters, in float64, with L = 1/η (``lipschitz``: null) or a given L:

    Δw_k = L (w^t - w̄_k),   Δ_k = F_k^q Δw_k,   h_k = q F_k^(q-1) ||Δw_k||² + L F_k^q,
    w^{t+1} = w^t - Σ_k Δ_k / Σ_k h_k.

With full participation the reference averages uniformly, so q = 0 gives exactly the uniform mean of
the local models, whatever η (tests check it); ``aggregation.weighting`` is not applied to Δ_k, h_k.
Buffers (BN running statistics) are averaged with the run's weights, num_batches_tracked takes the max.

Caveat (../specs/methods.md §2.11): L = 1/η assumes plain SGD. With Adam (Fed-LWR's setting) Δw_k is
not on a gradient scale and the q F^(q-1)||Δw||² term can dominate h and shrink the step. q is not
given by Fed-LWR; the default 0.1 is an untuned choice from the suggested grid {0.1, 0.5, 1, 2}.
"""

from __future__ import annotations

import math

import torch

from fedmedbench.fl import client, server
from fedmedbench.fl.data import eval_batches
from fedmedbench.ops.aggregate import aggregation_weights, parameter_keys, weighted_average

DEFAULTS = {"q": 0.1, "lipschitz": None}
PERSONALIZED = False


class Client(client.Client):
    def before_epoch(self, epoch):
        if epoch == 0:  # the received w^t, before any local step
            self.start_loss = self.train_loss()

    @torch.no_grad()
    def train_loss(self) -> float:
        """Mean task loss over the whole train split (sample-weighted), eval mode."""
        was_training = self.model.training
        self.model.eval()
        total, count = 0.0, 0
        for x, y, _ in eval_batches(self.data.train, self.cfg.eval_batch, self.cfg.intensity_scale):
            x, y = x.to(self.device), y.to(self.device)
            total += float(self.task_loss(self.model(x), y)) * len(y)
            count += len(y)
        self.model.train(was_training)
        return total / max(count, 1)

    def reply(self):
        return {**super().reply(), "loss": self.start_loss}


class Server(server.Server):
    def __init__(self, cfg, model, num_clients):
        super().__init__(cfg, model, num_clients)
        self.param_keys = parameter_keys(model)
        self.last_log = {}

    def aggregate(self, round_index, replies):
        q = float(self.params["q"])
        L = float(self.params["lipschitz"] or 1.0 / self.cfg.optimizer.lr)
        states = [r["state"] for r in replies]
        keys = set.intersection(*(set(s) for s in states))
        params = sorted(keys & self.param_keys)
        buffers = sorted(keys - self.param_keys)
        p = aggregation_weights([r["num_samples"] for r in replies], self.cfg.aggregation.weighting)
        self.global_state.update(weighted_average(states, p, buffers))

        w = {k: self.global_state[k].to(states[0][k].device, torch.float64) for k in params}
        numerator = {k: torch.zeros_like(w[k]) for k in params}
        h_total = 0.0
        self.last_log = {}
        for i, (state, reply) in enumerate(zip(states, replies)):
            loss = float(reply["loss"]) + 1e-10
            delta = {k: L * (w[k] - state[k].to(torch.float64)) for k in params}
            norm_sq = math.fsum(float((d * d).sum()) for d in delta.values())
            scale = loss**q
            for k in params:
                numerator[k] += scale * delta[k]
            h = (q * loss ** (q - 1) * norm_sq if q else 0.0) + L * scale
            h_total += h
            self.last_log[i] = {"loss": loss, "h": h}
        for k in params:
            self.global_state[k] = (w[k] - numerator[k] / h_total).to(self.global_state[k].dtype)

    def round_log(self, round_index):
        return self.last_log


__all__ = ["Client", "Server", "DEFAULTS", "PERSONALIZED"]
