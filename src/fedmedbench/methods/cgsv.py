"""CGSV (Xu, Lyu, Ma, Miao, Foo, Low, NeurIPS 2021): cosine gradient Shapley values and sparse rewards.

Per round (reference main.py L220-292, ../specs/methods.md §2.13):

1. agent i trains its own model (local epochs as the task), giving Δ_i on the trainable parameters;
   the model's parameters are then **reset** to their value before training (its own update is not
   applied; BN running statistics, which never travel, keep their update);
2. u_i = Γ Δ_i / (||Δ_i|| + 1e-7) (one norm over all parameters);
3. u_N = Σ_i w_i u_i, w = n_i/Σn in round 1 and the reputations r afterwards; the server model += u_N;
4. ψ_i = cos(u_i, u_N); r_i <- α r_i + (1 - α) ψ_i from r = 0 (the reference's ``rs = torch.zeros(N)``,
   so round 1 gives r ∝ ψ), clamped at >= 1e-3, normalised to sum 1;
5. q_i = tanh(β r_i) / max_j tanh(β r_j); agent i adds, per parameter tensor, the ⌈q_i·numel⌉
   largest-magnitude entries of u_N to its model (q_i = 1: all of them; the reference keeps numel - 1
   there, a quirk not reproduced).

Each agent is evaluated with its own model (``PERSONALIZED``).

**Γ** (``gamma``) is the server's step length: ||u_N|| <= Γ. The reference fixes it per dataset
(utils/arguments.py: 0.5 MNIST and 0.15 CIFAR-10, trained with SGD; 1 for the text models SST and MR,
trained with Adam) and no source gives it for a UNet, whose Adam round updates move each coordinate
up to ~η per local step: with Γ = 1 the step ||u_N|| <= 1 is about 1/||Δ|| of FedAvg's (||Δ|| ~ 23, a step
~0.043 of FedAvg's: **estimated** at Fed-LWR's size, derived in docs/reviewers/fedlwr.md). **Measured**
on the demo's Fed-LWR tasks, and with the paper's UNet on the demo data: ||Δ_i|| and the step against
FedAvg's in docs/reviewers/fedlwr.md, generated from benchmarks/results/2026-12-02-fair-steps.csv
(``benchmarks/bench_fair_steps.py``). ``gamma: null``
(default, **our adaptation**) sets Γ_t = Σ_i w_i ||Δ_i|| each round, the aggregation-weighted mean
length of this round's updates: normalisation still removes the magnitude differences between agents
(a large update buys no influence, CGSV's point), and when the agents' updates are equally long
u_N = Σ_i w_i Δ_i, FedAvg's step with CGSV's weights. A number fixes Γ (the reference's rule; the
``cgsv-official`` row: Γ = 1, its value for Adam-trained models). β = 1 is inside the reference's sweep
{0.5, 1, 1.2, 1.5, 2, 1e7}: with r ~ 1/K, tanh(β r) is nearly linear, so q_i ≈ r_i / max r (a reward
proportional to reputation); α = 0.95 as the reference.

``official_code: true`` takes the reference's reward mask instead of exactly ⌈q_i·numel⌉ entries: per
tensor the min(⌈q_i·numel⌉, numel - 1)-th largest magnitude is a threshold and every entry at least as
large is kept (``ops.sparsify.threshold_mask``), so q_i = 1 drops each tensor's smallest entry. (A
one-element tensor, where the reference's ``topk(·, 0)[-1]`` raises, is kept whole.) Its float32
normalisation and cosine (eps 1e-10) are rounding-level differences. The reference's agents also decay
their learning rate (``ExponentialLR``, 0.977-0.955 a round): a task setting here, constant as
Fed-LWR's Adam.
"""

from __future__ import annotations

import math

import torch

from fedmedbench.fl import client, server
from fedmedbench.ops.aggregate import add_to_parameters, parameter_keys
from fedmedbench.ops.sparsify import threshold_mask

DEFAULTS = {"gamma": None, "alpha": 0.95, "beta": 1.0, "official_code": False}
PARAM_SCHEMA = {
    "gamma": {"type": ["number", "null"], "exclusiveMinimum": 0},
    "alpha": {"type": "number", "minimum": 0, "maximum": 1},
    "beta": {"type": "number", "exclusiveMinimum": 0},
    "official_code": {"type": "boolean"},
}
PERSONALIZED = True


def top_magnitude(tensor: torch.Tensor, fraction: float) -> torch.Tensor:
    """``tensor`` with all but its ⌈fraction·numel⌉ largest-magnitude entries set to 0."""
    k = min(tensor.numel(), math.ceil(fraction * tensor.numel()))
    if k >= tensor.numel():
        return tensor.clone()
    out = torch.zeros_like(tensor).flatten()
    if k > 0:
        idx = tensor.flatten().abs().topk(k).indices
        out[idx] = tensor.flatten()[idx]
    return out.view_as(tensor)


def reference_reward(tensor: torch.Tensor, fraction: float) -> torch.Tensor:
    """The reference's layer-wise reward mask: threshold at the min(⌈fraction·numel⌉, numel - 1)-th
    largest magnitude, ties kept (a one-element tensor is kept whole, see the module docstring)."""
    n = tensor.numel()
    if n == 1:
        return tensor.clone()
    count = min(math.ceil(fraction * n), n - 1)
    return threshold_mask({"t": tensor}, count)["t"]


class Client(client.Client):
    def before_epoch(self, epoch):
        if epoch == 0:
            self.before = {n: p.detach().clone() for n, p in self.model.named_parameters()}

    def reply(self):
        update = {n: p.detach() - self.before[n] for n, p in self.model.named_parameters()}
        with torch.no_grad():  # reset: the agent's own update is not applied
            for n, p in self.model.named_parameters():
                p.copy_(self.before[n])
        return {"update": update, "num_samples": len(self.data.train), "steps": self.steps}

    def receive(self, package):
        if package is None:
            return
        if "state" in package:  # round 0: the common initialisation
            super().receive(package)
            return
        add_to_parameters(self.model, package["reward"])


class Server(server.Server):
    def __init__(self, cfg, model, num_clients):
        super().__init__(cfg, model, num_clients)
        self.param_keys = sorted(parameter_keys(model))
        self.reputation: list[float] | None = None
        self.rewards: list[dict] = [{} for _ in range(num_clients)]
        self.last_log = {}

    def package(self, client_index, round_index):
        if round_index == 0:
            return {"state": self.global_state}
        return {"reward": self.rewards[client_index]}

    def aggregate(self, round_index, replies):
        alpha, beta = self.params["alpha"], self.params["beta"]
        updates = [r["update"] for r in replies]
        norms = [math.sqrt(math.fsum(float((v.double() ** 2).sum()) for v in u.values())) for u in updates]
        if self.reputation is None:  # round 1: FedAvg's weights (the reference's shard sizes)
            total = float(sum(r["num_samples"] for r in replies))
            weights = [r["num_samples"] / total for r in replies]
        else:
            weights = self.reputation
        gamma = self.params["gamma"]
        if gamma is None:  # Γ_t: the weighted mean update length (module docstring)
            gamma = math.fsum(w * n for w, n in zip(weights, norms))
        normalised = [{k: gamma * v / (norm + 1e-7) for k, v in u.items()} for u, norm in zip(updates, norms)]
        agg = {}
        for k in self.param_keys:
            total = normalised[0][k] * weights[0]
            for u, w in zip(normalised[1:], weights[1:]):
                total = total + u[k] * w
            agg[k] = total
        for k in self.param_keys:
            self.global_state[k] = self.global_state[k].to(agg[k].device) + agg[k]
        flat_agg = torch.cat([agg[k].flatten().double() for k in self.param_keys])
        psi = []
        for u in normalised:
            flat = torch.cat([u[k].flatten().double() for k in self.param_keys])
            denom = float(flat.norm()) * float(flat_agg.norm())
            psi.append(float(flat @ flat_agg) / denom if denom > 0 else 0.0)
        previous = self.reputation if self.reputation is not None else [0.0] * len(replies)  # reference: rs = 0
        r = [max(alpha * p + (1 - alpha) * s, 1e-3) for p, s in zip(previous, psi)]
        total = math.fsum(r)
        self.reputation = [x / total for x in r]
        tanhs = [math.tanh(beta * x) for x in self.reputation]
        q = [t / max(tanhs) for t in tanhs]
        reward = reference_reward if self.params["official_code"] else top_magnitude
        self.rewards = [{k: reward(agg[k], q_i) for k in self.param_keys} for q_i in q]
        self.last_log = {
            i: {"reputation": self.reputation[i], "psi": psi[i], "reward_fraction": q[i], "gamma": gamma}
            for i in range(len(replies))
        }

    def round_log(self, round_index):
        return self.last_log

    def state_dict(self):
        return {**super().state_dict(), "reputation": self.reputation, "rewards": self.rewards}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.reputation, self.rewards = state["reputation"], state["rewards"]


__all__ = ["Client", "Server", "DEFAULTS", "PARAM_SCHEMA", "PERSONALIZED", "reference_reward", "top_magnitude"]
