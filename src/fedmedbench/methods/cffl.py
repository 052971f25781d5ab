"""CFFL (Lyu, Xu, Wang, Yu, "Collaborative Fairness in Federated Learning", 2020): reputation-based rewards.

Per round (reference Federated_Learner.py, ../specs/methods.md §2.12), on trainable parameters:

1. participant i trains its own persistent model: Δ_i, clipped elementwise to [-clip, clip]
   (``clip``: null = no clipping, the default, see below); the clipped update is applied to its model;
2. upload: the ``upload_fraction`` (θ_u) largest-magnitude entries of the clipped Δ_i over the whole
   model ('all' criterion), the rest zero;
3. validation of "federated model + upload_i". **Adaptation** (no public server data in medical
   silos): the server sends every candidate to every client (``Server.query``), each client returns
   the candidate's validation score on its own validation split (the candidate's parameters with the
   client's own BN statistics, which never travel), and acc_i is the mean over clients: a pooled
   validation set without moving data (K² evaluations a round). ``score``: ``metric`` = the run's
   selection metric (Dice, the reference's validation accuracy); ``loss`` = exp(-validation loss);
4. reputations over the reputable set R, from r = 0 (the reference's ``torch.zeros``):
   r_i <- fade·r_i + (1 - fade)·acc_i/Σ_R acc; r <- sinh(α r), normalised; participants with
   r_i < threshold_coef/|R| leave R for good (they then train alone: Solo); r renormalised over R;
5. U = Σ_{i∈R} (n_i/Σ_R n) upload_i ('mean'); the federated model += U;
6. download: i ∈ R adds the top-k entries of U by magnitude, k = (r_i / max r)(n_i / max n)·D
   (``download: reputation``; ``full``: all of U), then subtracts its own upload × n_i / max n.

With θ_u = 1, no clipping, equal shards, everyone reputable and ``download: full`` every model
becomes before + mean_j Δ_j: FedAvg in delta form (tests check it). BN statistics never travel.
Each participant is evaluated with its own model. θ_u = 0.1, α = 5, fade 0.8 and threshold 1/3 are
the reference's. With θ_u = 0.1, U has at most K·θ_u·D non-zero entries, so a download fraction
(r_i/max r)(n_i/max n) above U's non-zero share takes all of U (as the reference's magnitude
threshold does): reputations then act through removals only.

**clip**: the reference's elementwise bound is an absolute, per-dataset value (pytorch/utils/arguments.py:
0.01 for Adult and MNIST and 1e-3 for CIFAR-10, trained with SGD; 1e-3 for every Adam-trained text
model, IMDb, SST and MR; 0.01 in methods.md §2.12); with Adam each coordinate moves ~η per step, so an
absolute bound below η·steps truncates every participant's own training (the clipped update is what
it keeps). No source gives one for a UNet: null (no clipping, **our adaptation**), which beat 0.01 on
both demo tasks' validation Dice (prostate_lwr 89.5 vs 50.1, fundus 88.1 vs 86.1; docs/reviewers/fedlwr.md). The
``cffl-official`` row keeps the reference's rule: ``clip: 0.001`` (its Adam value), ``score: metric``.

``official_code: true`` takes the reference's conventions where ours differ: its masks keep every
entry at least as large as the k-th largest magnitude (``ops.sparsify.threshold_mask``, ties kept,
k = int(θ_u·D) for the upload and int((r_i/max r)(n_i/max n)·D) for the download) instead of exactly
⌈·⌉ entries, and its 'mean' weights are n_i / Σ n and n_i / max n over **all** participants, removed
ones included (ours: over R). With the clip binding, many entries equal ±clip exactly, so the
threshold mask uploads all of them, not θ_u of the model. The reference's ``alpha_decay`` (α(1+t/T),
Adult and MNIST only) and learning-rate decay are not reproduced.

**Why the demo's reputations never separated**: the candidates are the *federated* model plus one
upload, and the federated model only ever receives the mean of the uploads (top 10 % of updates
clipped at 0.01): it stays at its initialisation, whose argmax prediction is one class everywhere; a
small upload does not flip a single pixel, so every candidate had the same Dice in every round and
acc_i / Σ acc = 1/K exactly. ``score: loss`` (default) is continuous in the parameters, so candidates
are ranked even while the federated model is weak; ``metric`` keeps the reference's accuracy-like
score for comparison.
"""

from __future__ import annotations

import math

import torch

from fedmedbench.fl import client, server
from fedmedbench.fl.evaluation import evaluate
from fedmedbench.ops.aggregate import add_to_parameters, parameter_keys
from fedmedbench.ops.sparsify import threshold_mask

DEFAULTS = {
    "upload_fraction": 0.1,
    "clip": None,
    "alpha": 5.0,
    "fade": 0.8,
    "threshold_coef": 0.3333333333333333,
    "download": "reputation",
    "score": "loss",
    "official_code": False,
}
PARAM_SCHEMA = {
    "upload_fraction": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
    "clip": {"type": ["number", "null"], "exclusiveMinimum": 0},
    "alpha": {"type": "number", "exclusiveMinimum": 0},
    "fade": {"type": "number", "minimum": 0, "maximum": 1},
    "threshold_coef": {"type": "number", "minimum": 0, "maximum": 1},
    "download": {"enum": ["reputation", "full"]},
    "score": {"enum": ["loss", "metric"]},
    "official_code": {"type": "boolean"},
}
PERSONALIZED = True


def top_fraction(update: dict[str, torch.Tensor], fraction: float) -> dict[str, torch.Tensor]:
    """Keep the ⌈fraction·D⌉ largest-magnitude entries over all tensors together (D = total size)."""
    keys = list(update)
    flat = torch.cat([update[k].flatten() for k in keys])
    k = min(flat.numel(), math.ceil(fraction * flat.numel()))
    if k >= flat.numel():
        return {key: v.clone() for key, v in update.items()}
    mask = torch.zeros_like(flat, dtype=torch.bool)
    if k > 0:
        mask[flat.abs().topk(k).indices] = True
    out, start = {}, 0
    for key in keys:
        n = update[key].numel()
        out[key] = torch.where(mask[start : start + n].view_as(update[key]), update[key], torch.zeros_like(update[key]))
        start += n
    return out


def share(update: dict[str, torch.Tensor], fraction: float, official_code: bool) -> dict[str, torch.Tensor]:
    """The top ``fraction`` of ``update`` by magnitude over the whole model: exactly ⌈fraction·D⌉ entries,
    or (``official_code``) the reference's int(fraction·D)-th largest magnitude as a threshold, ties kept."""
    if not official_code:
        return top_fraction(update, fraction)
    size = sum(v.numel() for v in update.values())
    return threshold_mask(update, int(fraction * size))


def candidate_score(metrics: dict[str, float], score: str, selection_metric: str) -> float:
    """A candidate's validation score (higher is better, > 0 so that acc_i / Σ acc is a share)."""
    if score == "loss":
        return math.exp(-metrics["loss"])
    if score == "metric":
        return metrics[selection_metric]
    raise ValueError(f"cffl: score must be 'loss' or 'metric', got {score!r}")


class Client(client.Client):
    def before_epoch(self, epoch):
        if epoch == 0:
            self.before = {n: p.detach().clone() for n, p in self.model.named_parameters()}

    def reply(self):
        clip = self.params["clip"]
        update = {}
        with torch.no_grad():
            for n, p in self.model.named_parameters():
                delta = p.detach() - self.before[n]
                if clip is not None:
                    delta = delta.clamp(-clip, clip)
                p.copy_(self.before[n] + delta)
                update[n] = delta
        self.upload = share(update, self.params["upload_fraction"], self.params["official_code"])
        return {"upload": self.upload, "num_samples": len(self.data.train), "steps": self.steps}

    def answer(self, query):
        """The validation metric of every candidate model (a state dict of parameters) on this client."""
        scores = []
        backup = {k: v.clone() for k, v in self.model.state_dict().items()}
        for candidate in query["candidates"]:
            if candidate is None:
                scores.append(None)
                continue
            self.model.load_state_dict(candidate, strict=False)
            scores.append(
                candidate_score(
                    evaluate(self.model, self.data.val, self.cfg, self.device),
                    self.params["score"],
                    self.cfg.selection_metric,
                )
            )
        self.model.load_state_dict(backup)
        return {"scores": scores}

    def receive(self, package):
        if package is None:
            return
        if "state" in package:  # round 0: the common initialisation
            super().receive(package)
            return
        add_to_parameters(self.model, package["download"])


class Server(server.Server):
    def __init__(self, cfg, model, num_clients):
        super().__init__(cfg, model, num_clients)
        self.param_keys = sorted(parameter_keys(model))
        self.reputation = [0.0] * num_clients  # the reference's torch.zeros: round 1 ranks by acc alone
        self.reputable = [True] * num_clients
        self.downloads: list[dict | None] = [None] * num_clients
        self.last_log = {}

    def package(self, client_index, round_index):
        if round_index == 0:
            return {"state": self.global_state}
        download = self.downloads[client_index]
        return None if download is None else {"download": download}

    def query(self, round_index, replies):
        candidates = []
        for i, r in enumerate(replies):
            if not self.reputable[i]:
                candidates.append(None)
                continue
            candidates.append(
                {k: self.global_state[k].to(r["upload"][k].device) + r["upload"][k] for k in self.param_keys}
            )
        return [{"candidates": candidates}] * len(replies)

    def aggregate(self, round_index, replies):
        p = self.params
        members = [i for i in range(len(replies)) if self.reputable[i]]
        acc = {}
        for i in members:
            scores = [r["answer"]["scores"][i] for r in replies]
            acc[i] = math.fsum(scores) / len(scores)
        total_acc = math.fsum(acc.values()) or 1.0
        r = {i: p["fade"] * self.reputation[i] + (1 - p["fade"]) * acc[i] / total_acc for i in members}
        r = {i: math.sinh(p["alpha"] * v) for i, v in r.items()}
        total = math.fsum(r.values())
        r = {i: v / total for i, v in r.items()}
        threshold = p["threshold_coef"] / len(members)
        for i in list(members):
            if r[i] < threshold:
                self.reputable[i] = False
        members = [i for i in members if self.reputable[i]] or members  # never empty the federation
        total = math.fsum(r[i] for i in members)
        self.reputation = [r[i] / total if i in members else 0.0 for i in range(len(replies))]

        n = {i: replies[i]["num_samples"] for i in members}
        # official_code: the reference's 'mean' weights over all participants, removed ones included
        counted = [r_["num_samples"] for r_ in replies] if p["official_code"] else list(n.values())
        n_total, n_max = float(sum(counted)), float(max(counted))
        uploads = [r_["upload"] for r_ in replies]
        combined = {}
        for k in self.param_keys:
            total_k = None
            for i in members:
                term = uploads[i][k] * (n[i] / n_total)
                total_k = term if total_k is None else total_k + term
            combined[k] = total_k
            self.global_state[k] = self.global_state[k].to(total_k.device) + total_k
        r_max = max(self.reputation[i] for i in members)
        self.downloads = [None] * len(replies)
        for i in members:
            if p["download"] == "full":
                allocated = dict(combined)
            elif p["download"] == "reputation":
                allocated = share(combined, (self.reputation[i] / r_max) * (n[i] / n_max), p["official_code"])
            else:
                raise ValueError(f"cffl: download must be 'reputation' or 'full', got {p['download']!r}")
            self.downloads[i] = {k: allocated[k] - uploads[i][k] * (n[i] / n_max) for k in self.param_keys}
        self.last_log = {
            i: {
                "reputation": self.reputation[i],
                "validation": acc.get(i, float("nan")),
                "reputable": float(self.reputable[i]),
            }
            for i in range(len(replies))
        }

    def round_log(self, round_index):
        return self.last_log

    def state_dict(self):
        return {
            **super().state_dict(),
            "reputation": self.reputation,
            "reputable": self.reputable,
            "downloads": self.downloads,
        }

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.reputation, self.reputable, self.downloads = state["reputation"], state["reputable"], state["downloads"]


__all__ = ["Client", "Server", "DEFAULTS", "PARAM_SCHEMA", "PERSONALIZED", "candidate_score", "share", "top_fraction"]
