"""FedAdam (Reddi et al., ICLR 2021, Algorithm 2 with the Adam server rule).

Clients train as in FedAvg. Over the trainable parameters the server forms, with the run's
aggregation weights p_i and Delta_i = w_i - w^t,

    Delta_t = sum_i p_i Delta_i
    m_t = beta1 m_{t-1} + (1 - beta1) Delta_t
    v_t = beta2 v_{t-1} + (1 - beta2) Delta_t^2            (elementwise)
    w^{t+1} = w^t + eta m_t / (sqrt(v_t) + tau)

with m_{-1} = 0, v_{-1} = tau^2 (the paper's v_{-1} >= tau^2) and no bias correction. Buffers (BN
running statistics, counters) are averaged as in FedAvg, never fed to Adam (methods.md §1.2, §2.4).
m and v are the server's state and go into its checkpoint.

Default eta = 1e-3 (``server_lr``): each coordinate moves by about eta |Delta| / (|Delta| + tau) per
round, so eta must be of the order of the per-round client update. With local Adam at lr 1e-4..1e-3
(prostate, nuclei) or SGD at lr 1e-3 (Camelyon17), |Delta| is about 1e-4..1e-3 ~ tau, where eta =
1e-3 moves a weight by about as much as FedAvg does; the libraries' 0.1 (FL-bench, Flower) would move
every weight by ~0.1 per round and wreck these networks (methods.md §2.4). Tunable: eta in
{1e-4 .. 1e-2}, tau in {1e-6 .. 1e-3}.
"""

from __future__ import annotations

import torch

from fedmedbench.fl import server
from fedmedbench.fl.client import Client
from fedmedbench.ops.aggregate import aggregation_weights, parameter_keys, weighted_average

DEFAULTS = {"server_lr": 1e-3, "beta1": 0.9, "beta2": 0.99, "tau": 1e-3}
# Ranges and choices of the parameters (their types come from DEFAULTS): checked at DAG time.
PARAM_SCHEMA = {
    "server_lr": {"type": "number", "exclusiveMinimum": 0},
    "beta1": {"type": "number", "minimum": 0, "exclusiveMaximum": 1},
    "beta2": {"type": "number", "minimum": 0, "exclusiveMaximum": 1},
    "tau": {"type": "number", "exclusiveMinimum": 0},
}
PERSONALIZED = False


class Server(server.Server):
    def __init__(self, cfg, model, num_clients):
        super().__init__(cfg, model, num_clients)
        self.param_keys = parameter_keys(model)
        tau = self.params["tau"]
        keys = sorted(self.param_keys)
        self.m = {k: torch.zeros_like(self.global_state[k]) for k in keys}
        self.v = {k: torch.full_like(self.global_state[k], tau * tau) for k in keys}

    def aggregate(self, round_index, replies):
        p = aggregation_weights([r["num_samples"] for r in replies], self.cfg.aggregation.weighting)
        keys = set.intersection(*(set(r["state"]) for r in replies))
        params = sorted(keys & self.param_keys)
        states = [r["state"] for r in replies]
        self.global_state.update(weighted_average(states, p, sorted(keys - self.param_keys)))  # buffers: FedAvg

        eta, beta1, beta2, tau = (self.params[k] for k in ("server_lr", "beta1", "beta2", "tau"))
        for key in params:
            w = self.global_state[key].to(states[0][key].device)
            delta = weighted_average([{key: s[key] - w} for s in states], p, [key])[key]
            m = self.m[key].to(delta.device) * beta1 + delta * (1.0 - beta1)
            v = self.v[key].to(delta.device) * beta2 + delta * delta * (1.0 - beta2)
            self.m[key], self.v[key] = m, v
            self.global_state[key] = w + eta * m / (v.sqrt() + tau)

    def state_dict(self):
        return {**super().state_dict(), "m": self.m, "v": self.v}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.m, self.v = state["m"], state["v"]


__all__ = ["Client", "Server", "DEFAULTS", "PERSONALIZED"]
