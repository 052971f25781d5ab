"""IDA, inverse distance aggregation (Yeganeh, Farshad, Navab, Albarqouni, DCL@MICCAI 2020).

theta_bar = the unweighted mean of the client models; d_k = ||theta_k - theta_bar||_2 over all
trainable parameters (flattened, the whole model); alpha_k = (1 / d_k) / sum_j (1 / d_j), with d_k
floored at ``eps``; the new global model is sum_k alpha_k theta_k over every shared tensor (float
buffers included; integer counters take the max, as everywhere). With two clients d_1 = d_2, so IDA is
the uniform average; with all d_k = 0 (identical clients) the weights are uniform. A global method.
"""

from __future__ import annotations

import torch

from fedmedbench.fl import server
from fedmedbench.fl.client import Client
from fedmedbench.ops.aggregate import parameter_keys, weighted_average

DEFAULTS = {"eps": 1e-12}
# Ranges and choices of the parameters (their types come from DEFAULTS): checked at DAG time.
PARAM_SCHEMA = {"eps": {"type": "number", "exclusiveMinimum": 0}}
PERSONALIZED = False


def inverse_distance_weights(states: list[dict], keys: list[str], eps: float = 1e-12) -> list[float]:
    """alpha_k of IDA from the clients' tensors at ``keys`` (trainable parameters)."""
    count = len(states)
    squared = torch.zeros(count, dtype=torch.float64)
    for key in keys:
        stacked = torch.stack([s[key].detach().double() for s in states])
        squared += ((stacked - stacked.mean(0)) ** 2).flatten(1).sum(1).cpu()
    distance = squared.sqrt()
    if bool((distance <= eps).all()):
        return [1.0 / count] * count
    inverse = 1.0 / distance.clamp_min(eps)
    return (inverse / inverse.sum()).tolist()


class Server(server.Server):
    def __init__(self, cfg, model, num_clients):
        super().__init__(cfg, model, num_clients)
        self.trainable = parameter_keys(model)
        self.alphas: list[float] = []

    def aggregate(self, round_index, replies):
        keys = sorted(set.intersection(*(set(r["state"]) for r in replies)))
        states = [r["state"] for r in replies]
        self.alphas = inverse_distance_weights(states, [k for k in keys if k in self.trainable], self.params["eps"])
        self.global_state.update(weighted_average(states, self.alphas, keys))

    def round_log(self, round_index):
        return {i: {"ida_weight": a} for i, a in enumerate(self.alphas)}


__all__ = ["Client", "Server", "DEFAULTS", "PERSONALIZED", "inverse_distance_weights"]
