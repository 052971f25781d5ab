"""PRR-FL (Chen, Zhu, Yang, Yuan, MICCAI 2021): Progressive Fourier Aggregation + Deputy-Enhanced Transfer.

Each client holds a personalized model p (``self.model``: trained, evaluated) and a deputy d.

Upload (``upload``): ``personalized`` (paper, Sec. 2.1: "the personalized model p_k ... is uploaded")
sends p; ``deputy`` (official code: ``main.py`` hands the deputies to ``communication``) sends d, so
the federated model is d and p learns from it only through DET's KL. Without DET (``det: false``)
there is no deputy and p is sent either way.

Server (PFA, ``ops.fourier.fourier_aggregate``): the uploaded weights of every conv and linear layer
are aggregated in the frequency domain, each client getting **its own** result (its phase and
high-frequency amplitude, the clients' mean low-frequency amplitude) as its package; the box radius
grows linearly from ``radius_start`` to ``radius_end`` over the rounds (official scale: 0.7 -> 0.95,
the paper's r0 = 0.35, r1 = 0.48 of the axis). BN layers (found by module type) never leave the
client; every other shared tensor (biases) is averaged with the run's weights.

Client (DET, ``ops.distill``): the package goes into the deputy (its BN stays its own). Before every
local epoch the stage is chosen from phi = macro F1 of d and p (``det_stage``; lambda1 = 0.7,
lambda2 = 0.9): Recover (p: CE; d: CE + KL(p || d)), Exchange (both CE + KL toward the other),
Sublimate (d: CE; p: CE + KL(d || p)). KL(teacher || student) as the official code (Eqs. 4-5 read
literally give the reverse; docs/reviewers/prrfl.md). The teacher is detached and both models step on
every batch. ``phi_split: val`` (paper: the client's validation set) or ``train`` (official: the
training data, scored here without augmentation); ``reset_stage_each_round`` (default true, paper
and official: every round starts with Recover after the deputy was overwritten; false: the stage
carries over and only phi moves it).

Ablations: ``det: false`` (w/o DET) loads the package into p, FedBN-style, no deputy;
``pfa: false`` (w/o PFA) sends everyone the element-wise average (FedBN's aggregation).
``fourier_mode``: ``paper`` (closed box |f| <= r*dim of Eq. 2, weighted mean) or ``official``
(half-open box, unweighted mean, real part); see ``ops.fourier``.
"""

from __future__ import annotations

import copy

from torch import nn

from fedmedbench.fl import client, server
from fedmedbench.fl.client import build_optimizer
from fedmedbench.fl.evaluation import evaluate
from fedmedbench.ops.aggregate import aggregation_weights, batchnorm_keys, weighted_average
from fedmedbench.ops.distill import EXCHANGE, NO_STAGE, RECOVER, STAGE_NAMES, SUBLIMATE, det_stage, kl_to_teacher
from fedmedbench.ops.fourier import fourier_aggregate, progressive_radius

DEFAULTS = {
    "pfa": True,
    "det": True,
    "radius_start": 0.7,
    "radius_end": 0.95,
    "fourier_mode": "paper",
    "recover_threshold": 0.7,
    "sublimate_threshold": 0.9,
    "phi_split": "val",
    "phi_metric": "f1_macro",
    "reset_stage_each_round": True,
    "upload": "personalized",
}
# Ranges and choices of the parameters (their types come from DEFAULTS): checked at DAG time.
PARAM_SCHEMA = {
    "radius_start": {"type": "number", "minimum": 0, "maximum": 1},
    "radius_end": {"type": "number", "minimum": 0, "maximum": 1},
    "fourier_mode": {"enum": ["paper", "official"]},
    "recover_threshold": {"type": "number", "minimum": 0, "maximum": 1},
    "sublimate_threshold": {"type": "number", "minimum": 0, "maximum": 1},
    "phi_split": {"enum": ["val", "train"]},
    "phi_metric": {"enum": ["f1_macro", "auc_macro", "accuracy"]},
    "upload": {"enum": ["personalized", "deputy"]},
}
PERSONALIZED = True


def fourier_keys(model: nn.Module) -> set[str]:
    """The weights PFA transforms: every conv and linear layer's ``weight``."""
    return {f"{name}.weight" for name, module in model.named_modules() if isinstance(module, (nn.Conv2d, nn.Linear))}


class Server(server.Server):
    def __init__(self, cfg, model, num_clients):
        super().__init__(cfg, model, num_clients)
        self.fourier = fourier_keys(model)
        self.packages: list[dict] = []

    def package(self, client_index, round_index):
        if round_index == 0:
            return {"state": self.global_state}  # the common initialisation, for p and d
        return {"state": self.packages[client_index]}

    def aggregate(self, round_index, replies):
        states = [r["state"] for r in replies]
        weights = aggregation_weights([r["num_samples"] for r in replies], self.cfg.aggregation.weighting)
        keys = sorted(set.intersection(*(set(s) for s in states)))
        averaged = weighted_average(
            states, weights, [k for k in keys if not (self.params["pfa"] and k in self.fourier)]
        )
        self.global_state.update(averaged)
        self.packages = [dict(averaged) for _ in states]
        if self.params["pfa"]:
            radius = progressive_radius(
                round_index, self.cfg.rounds, self.params["radius_start"], self.params["radius_end"]
            )
            for key in (k for k in keys if k in self.fourier):
                for package, tensor in zip(
                    self.packages,
                    fourier_aggregate([s[key] for s in states], radius, weights, self.params["fourier_mode"]),
                ):
                    package[key] = tensor
        self.stages = [r.get("stages", []) for r in replies]

    def round_log(self, round_index):
        """Local epochs spent in each DET stage this round, per client."""
        if not self.params["det"]:
            return {}
        return {
            i: {f"det_{name}_epochs": sum(s == stage for s in stages) for stage, name in STAGE_NAMES.items()}
            for i, stages in enumerate(self.stages)
        }


class Client(client.Client):
    def __init__(self, cfg, index, data, model, generator, device):
        super().__init__(cfg, index, data, model, generator, device)
        self.deputy = copy.deepcopy(self.model)
        self.deputy_optimizer = build_optimizer(self.deputy.parameters(), cfg.optimizer)
        self.stage = NO_STAGE
        self.stages: list[int] = []  # this round's stage per local epoch (logged by the server)

    def declare_local_keys(self):
        return super().declare_local_keys() | batchnorm_keys(self.model)

    def receive(self, package):
        if package is None:
            return
        if self.round_index == 0 or not self.params["det"]:
            super().receive(package)  # round 0: the common init; w/o DET: p takes the PFA result
        if self.params["det"]:
            shared = {k: v for k, v in package["state"].items() if k not in self.local_keys}
            self.deputy.load_state_dict(shared, strict=False)
            if self.cfg.reset_optimizer_each_round:
                self.optimizer = build_optimizer(self.model.parameters(), self.cfg.optimizer)
                self.deputy_optimizer = build_optimizer(self.deputy.parameters(), self.cfg.optimizer)
            if self.params["reset_stage_each_round"]:
                self.stage = NO_STAGE

    def optimizers(self):
        return [self.optimizer, self.deputy_optimizer] if self.params["det"] else [self.optimizer]

    def phi(self, model: nn.Module) -> float:
        split = self.data.val if self.params["phi_split"] == "val" else self.data.train
        score = evaluate(model, split, self.cfg, self.device)[self.params["phi_metric"]]
        model.train()
        return score

    def before_epoch(self, epoch):
        if epoch == 0:
            self.stages = []
        if not self.params["det"]:
            return
        if self.stage == NO_STAGE:  # phi is not read: the first stage is always Recover
            self.stage = RECOVER
        else:
            self.stage = det_stage(
                self.stage,
                self.phi(self.deputy),
                self.phi(self.model),
                self.params["recover_threshold"],
                self.params["sublimate_threshold"],
            )
        self.deputy.train()
        self.stages.append(self.stage)

    def train_step(self, x, y):
        if not self.params["det"]:
            return super().train_step(x, y)
        self.optimizer.zero_grad(set_to_none=True)
        self.deputy_optimizer.zero_grad(set_to_none=True)
        personal_logits, deputy_logits = self.model(x), self.deputy(x)
        loss_p = self.task_loss(personal_logits, y)
        loss_d = self.task_loss(deputy_logits, y)
        if self.stage in (EXCHANGE, SUBLIMATE):
            loss_p = loss_p + kl_to_teacher(personal_logits, deputy_logits)
        if self.stage in (RECOVER, EXCHANGE):
            loss_d = loss_d + kl_to_teacher(deputy_logits, personal_logits)
        (loss_p + loss_d).backward()  # teachers are detached: each loss reaches only its student
        self.optimizer.step()
        self.deputy_optimizer.step()
        return loss_p.detach()

    def reply(self):
        out = {**super().reply(), "stages": list(self.stages)}
        if self.params["det"] and self.params["upload"] == "deputy":
            # The official code aggregates the deputies; p never leaves the client.
            out["state"] = {k: v for k, v in self.deputy.state_dict().items() if k not in self.local_keys}
        return out

    def state_dict(self):
        return {
            **super().state_dict(),
            "deputy": self.deputy.state_dict(),
            "deputy_optimizer": self.deputy_optimizer.state_dict(),
            "stage": self.stage,
        }

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.deputy.load_state_dict(state["deputy"])
        self.deputy_optimizer.load_state_dict(state["deputy_optimizer"])
        self.stage = int(state["stage"])


__all__ = ["Client", "Server", "DEFAULTS", "PERSONALIZED", "fourier_keys"]
