"""FedNova (Wang et al., NeurIPS 2020): normalized averaging.

Client i runs its usual local solver for tau_i optimizer steps and reports the normalizer ||a_i||_1
with its model. The server forms, over the trainable parameters,

    d_i = (w^t - w_i) / ||a_i||_1,   tau_eff = sum_i p_i ||a_i||_1,   w^{t+1} = w^t - tau_eff sum_i p_i d_i

with the run's aggregation weights p_i. Buffers (BN running statistics) are averaged with the same
p_i, as in FedAvg, and never normalized (methods.md §1.2). Written as a combination of models this is
w^{t+1} = c w^t + sum_i q_i w_i with q_i = p_i tau_eff / ||a_i||_1 and c = 1 - sum_i q_i: equal
normalizers give q_i = p_i and c = 0, i.e. exactly FedAvg's weighted average.

The normalizer is the L1 norm of the vector a_i whose entry s is the coefficient, in units of the
learning rate eta, with which the gradient of local step s enters w^t - w_i:

- plain SGD: a = (1, ..., 1), ||a||_1 = tau_i;
- SGD with momentum rho (buffer starting at zero): ||a||_1 = sum_{t=1..tau} (1 - rho^t)/(1 - rho);
- proximal term mu/2 ||w - w^t||^2 (``proximal_mu``): ||a||_1 = [1 - (1 - eta mu)^tau]/(eta mu);
- both: the prox gradient is added to ``.grad`` before the optimizer step (as our FedProx), so it
  passes through the momentum buffer; the coefficients of that joint linear recursion are computed
  exactly (``normalizer``), rather than chaining the two closed forms as FedNova's code does.

Weight decay counts as part of the gradient (as in FedNova's code). Adam has no such closed form: we
fall back to a_i = tau_i (the usual choice, methods.md §4.4) and log a warning. Optional server
momentum ``server_momentum`` (FedNova's gmf): b <- gmf b + (w^t - w^{t+1})/eta, w^{t+1} = w^t - eta b,
with eta the client learning rate, as in FedNova's code.
"""

from __future__ import annotations

import logging
import math

import torch

from fedmedbench.fl import client, server
from fedmedbench.ops.aggregate import aggregation_weights, parameter_keys, weighted_average

log = logging.getLogger("fedmedbench.methods.fednova")

DEFAULTS = {"proximal_mu": 0.0, "server_momentum": 0.0}
# Ranges and choices of the parameters (their types come from DEFAULTS): checked at DAG time.
PARAM_SCHEMA = {
    "proximal_mu": {"type": "number", "minimum": 0},
    "server_momentum": {"type": "number", "minimum": 0, "exclusiveMaximum": 1},
}
PERSONALIZED = False


def normalizer(steps: int, lr: float, momentum: float = 0.0, mu: float = 0.0) -> float:
    """||a||_1 for ``steps`` SGD steps with momentum ``momentum`` (buffer starting at zero, no
    dampening) and a proximal gradient ``mu (w - w^t)`` fed through the momentum buffer.

    The update is linear in the gradients with a step-invariant recursion, so the coefficient of the
    gradient of step s in w^t - w_tau depends only on tau - s: it is the response r_{tau-s} of the
    recursion b_k = rho b_{k-1} - lr mu y_{k-1}, y_k = y_{k-1} + b_k to a unit impulse (b_0 = y_0 = 1;
    y is -(w - w^t)/lr). ||a||_1 = sum_k |r_k| over k = 0..steps-1.
    """
    if steps <= 0:
        return 0.0
    if mu == 0.0:
        if momentum == 0.0:
            return float(steps)
        return (steps - momentum * (1.0 - momentum**steps) / (1.0 - momentum)) / (1.0 - momentum)
    if momentum == 0.0:
        return (1.0 - (1.0 - lr * mu) ** steps) / (lr * mu)
    b = y = 1.0
    total = 1.0
    for _ in range(steps - 1):
        b = momentum * b - lr * mu * y
        y = y + b
        total += abs(y)
    return total


class Client(client.Client):
    def receive(self, package):
        super().receive(package)
        if self.params["proximal_mu"] and package is not None:
            self.anchor = [p.detach().clone() for p in self.model.parameters()]

    @torch.no_grad()
    def after_backward(self):
        mu = self.params["proximal_mu"]
        if mu:
            for param, anchor in zip(self.model.parameters(), self.anchor):
                if param.grad is not None:
                    param.grad.add_(param - anchor, alpha=mu)

    def normalizer(self) -> float:
        opt = self.cfg.optimizer
        if opt.name != "sgd":
            return float(self.steps)  # fallback a_i = tau_i (warned once by the server)
        return normalizer(self.steps, opt.lr, opt.momentum, self.params["proximal_mu"])

    def reply(self):
        return {**super().reply(), "normalizer": self.normalizer()}

    def state_dict(self):
        state = super().state_dict()
        if self.params["proximal_mu"]:
            state["anchor"] = self.anchor
        return state

    def load_state_dict(self, state):
        super().load_state_dict(state)
        if "anchor" in state:
            self.anchor = state["anchor"]


class Server(server.Server):
    def __init__(self, cfg, model, num_clients):
        super().__init__(cfg, model, num_clients)
        self.param_keys = parameter_keys(model)
        self.momentum_buffer: dict[str, torch.Tensor] = {}
        opt = cfg.optimizer
        if opt.name != "sgd":
            log.warning(
                "FedNova with a %r local optimizer: its normalizer has no closed form, falling back to "
                "a_i = tau_i (local steps); with equal tau_i this is exactly FedAvg",
                opt.name,
            )
        elif opt.momentum and not cfg.reset_optimizer_each_round:
            log.warning(
                "FedNova with SGD momentum %g and reset_optimizer_each_round: false: the momentum buffer "
                "carries over between rounds while the normalizer assumes it starts at zero (as FedNova's "
                "code resets it); set reset_optimizer_each_round: true for the exact rule",
                opt.momentum,
            )

    def aggregate(self, round_index, replies):
        p = aggregation_weights([r["num_samples"] for r in replies], self.cfg.aggregation.weighting)
        keys = set.intersection(*(set(r["state"]) for r in replies))
        params = sorted(keys & self.param_keys)
        others = sorted(keys - self.param_keys)
        states = [r["state"] for r in replies]
        self.global_state.update(weighted_average(states, p, others))  # buffers: FedAvg

        a = [float(r["normalizer"]) for r in replies]
        if any(not (x > 0) for x in a):
            raise ValueError(f"FedNova: every client needs a positive normalizer, got {a}")
        total = math.fsum(p)
        # q_i = p_i tau_eff / a_i, formed so that equal a_i give q_i = p_i and c = 0 exactly.
        q = [p_i * (math.fsum(p_j * (a_j / a_i) for p_j, a_j in zip(p, a)) / total) for p_i, a_i in zip(p, a)]
        c = 1.0 - math.fsum(q) / total
        if c == 0.0:
            new = weighted_average(states, q, params)  # FedAvg's form (equal normalizers)
        else:
            new = {}
            for key in params:
                w = self.global_state[key].to(states[0][key].device)
                step = (w - states[0][key]) * q[0]
                for state, q_i in zip(states[1:], q[1:]):
                    step = step + (w - state[key]) * q_i
                new[key] = w - step

        gmf = self.params["server_momentum"]
        if gmf:
            lr = self.cfg.optimizer.lr
            for key in params:
                w = self.global_state[key].to(new[key].device)
                direction = (w - new[key]) / lr
                buf = self.momentum_buffer.get(key)
                buf = direction if buf is None else buf.to(direction.device) * gmf + direction
                self.momentum_buffer[key] = buf
                new[key] = w - lr * buf
        self.global_state.update(new)

    def state_dict(self):
        return {**super().state_dict(), "momentum_buffer": self.momentum_buffer}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.momentum_buffer = state["momentum_buffer"]


__all__ = ["Client", "Server", "DEFAULTS", "PERSONALIZED", "normalizer"]
