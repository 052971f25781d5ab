"""q-FedAvg (Li, Sanjabi, Beirami, Smith, ICLR 2020 "Fair Resource Allocation in FL").

Client k, round t: F_k = the task loss of the received w^t over its train split, before training, in
eval mode (+1e-10 as the reference code): the mean of the per-batch losses of its evaluation batches
(``eval_batch_size``), each weighted by its sample count. fair_flearn evaluates the loss of the whole
split in one call; the two are equal for a per-sample mean loss (cross-entropy) and for a split that fits
one evaluation batch, not for a batch-pooled soft Dice over several batches. Then ordinary local
training to w̄_k.
Server, on trainable parameters, in float64:

    Δw_k = L (w^t - w̄_k),   Δ_k = F_k^q Δw_k,   h_k = q F_k^(q-1) ||Δw_k||² + L F_k^q,
    w^{t+1} = w^t - Σ_k Δ_k / Σ_k h_k.

With full participation the reference averages uniformly, so q = 0 gives exactly the uniform mean of
the local models, whatever L (tests check it); ``aggregation.weighting`` is not applied to Δ_k, h_k.
Buffers (BN running statistics) are averaged with the run's weights, num_batches_tracked takes the max.

**L** (``lipschitz``: a number fixes it; null applies ``lipschitz_rule``):

- ``inverse_lr``: L = 1/η, the reference's value (the ``qfedavg-official`` row). It reads the
  local update as one plain-SGD step of length 1/L, so Δw_k = L(w^t - w̄_k) stands for ∇F_k(w^t).
  With Adam every coordinate moves ~η per step, Δw_k is far larger than any gradient, the
  q F^(q-1)||Δw||² term exceeds L F^q by the factor q L ||w^t - w̄_k||² / F_k and the global model
  moves about 1 / (1 + that factor) of FedAvg's step: ~1e5-1e6 and ~1e-6-1e-5, **estimated** at paper size (derived in
  docs/reviewers/fedlwr.md). **Measured** on the demo's Fed-LWR tasks, and with the paper's UNet on the
  demo data: both in docs/reviewers/fedlwr.md, generated from
  benchmarks/results/2026-12-02-fair-steps.csv (``benchmarks/bench_fair_steps.py``).
- ``smoothness_cap`` (default, **our adaptation**; the ``qfedavg`` row):
  L = min(1/η, min_k 2 F_k / ||w^t - w̄_k||²). The reference's own model bounds its gradient
  estimate: for a loss F >= 0 with L-Lipschitz gradient, ||∇F||² <= 2 L F, i.e.
  L ||w^t - w̄_k||² <= 2 F_k with ∇F_k ≈ L(w^t - w̄_k). The cap is the largest L for which every
  client's update is such a gradient step. Then q L ||w^t - w̄_k||² / F_k <= 2q, so
  h_k ∈ [1, 1 + 2q] · L F_k^q and the step is c · Σ F_k^q (w^t - w̄_k) / Σ F_k^q with c ∈ [1/(1+2q), 1]:
  the F^q-reweighted mean of the local updates on FedAvg's scale (q = 0: FedAvg's uniform mean;
  q = 1: at least a third of it). Where 1/η already satisfies the bound (plain SGD with a small step)
  it is the reference's L unchanged.

q is given by neither Fed-LWR nor the q-FFL paper for this task: 0.5, the best mean validation Dice of
the grid {0.1, 0.5, 1, 2} (../specs/methods.md §2.11) on both demo tasks (prostate_lwr 76.8 / 79.9 /
61.1 / 59.1, fundus 89.2 / 91.2 / 87.0 / 74.9; docs/reviewers/fedlwr.md). Rerun the grid on real validation
data at paper size before trusting it there.
"""

from __future__ import annotations

import math

import torch

from fedmedbench.fl import client, server
from fedmedbench.fl.data import eval_batches
from fedmedbench.ops.aggregate import aggregation_weights, parameter_keys, weighted_average

DEFAULTS = {"q": 0.5, "lipschitz": None, "lipschitz_rule": "smoothness_cap"}
PARAM_SCHEMA = {
    "q": {"type": "number", "minimum": 0, "maximum": 100},
    "lipschitz": {"type": ["number", "null"], "exclusiveMinimum": 0},
    "lipschitz_rule": {"enum": ["smoothness_cap", "inverse_lr"]},
}
PERSONALIZED = False


class Client(client.Client):
    def before_epoch(self, epoch):
        if epoch == 0:  # the received w^t, before any local step
            self.start_loss = self.train_loss()

    @torch.no_grad()
    def train_loss(self) -> float:
        """F_k: the per-batch task losses over the train split's evaluation batches, averaged with their
        sample counts, eval mode (not one loss of the whole split: see the module docstring)."""
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

    def lipschitz(self, losses: list[float], sq_distances: list[float]) -> float:
        """L for this round (see the module docstring); ``sq_distances`` = ||w^t - w̄_k||²."""
        if self.params["lipschitz"] is not None:
            return float(self.params["lipschitz"])
        rule = self.params["lipschitz_rule"]
        inverse_lr = 1.0 / self.cfg.optimizer.lr
        if rule == "inverse_lr":
            return inverse_lr
        if rule == "smoothness_cap":
            caps = [2.0 * f / d for f, d in zip(losses, sq_distances) if d > 0]
            return min([inverse_lr, *caps])
        raise ValueError(f"qfedavg: lipschitz_rule must be 'smoothness_cap' or 'inverse_lr', got {rule!r}")

    def aggregate(self, round_index, replies):
        q = float(self.params["q"])
        states = [r["state"] for r in replies]
        keys = set.intersection(*(set(s) for s in states))
        params = sorted(keys & self.param_keys)
        buffers = sorted(keys - self.param_keys)
        p = aggregation_weights([r["num_samples"] for r in replies], self.cfg.aggregation.weighting)
        self.global_state.update(weighted_average(states, p, buffers))

        w = {k: self.global_state[k].to(states[0][k].device, torch.float64) for k in params}
        diffs = [{k: w[k] - state[k].to(torch.float64) for k in params} for state in states]  # w^t - w̄_k
        sq_distances = [math.fsum(float((d * d).sum()) for d in diff.values()) for diff in diffs]
        losses = [float(r["loss"]) + 1e-10 for r in replies]
        L = self.lipschitz(losses, sq_distances)
        numerator = {k: torch.zeros_like(w[k]) for k in params}
        h_total = 0.0
        self.last_log = {}
        for i, (diff, sq, loss) in enumerate(zip(diffs, sq_distances, losses)):
            scale = loss**q
            for k in params:
                numerator[k] += (scale * L) * diff[k]
            # ||Δw_k||² = L² ||w^t - w̄_k||²
            h = (q * loss ** (q - 1) * L * L * sq if q else 0.0) + L * scale
            h_total += h
            self.last_log[i] = {"loss": loss, "h": h, "lipschitz": L}
        for k in params:
            self.global_state[k] = (w[k] - numerator[k] / h_total).to(self.global_state[k].dtype)

    def round_log(self, round_index):
        return self.last_log


__all__ = ["Client", "Server", "DEFAULTS", "PARAM_SCHEMA", "PERSONALIZED"]
