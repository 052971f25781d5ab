"""FedCE (Jiang et al., CVPR 2023): fair aggregation by client contribution estimation.

Follows the 2023 NVFlare code (fedce_assembler.py + the prostate FedCE learner), ../specs/methods.md §2.14:

Client k, round t (our rounds are 1-based; round 1 is NVFlare's t = 0):
  * minus model θ_{-k} = (θ^t - c_k θ_k^{t-1}) / (1 - c_k) from the received θ^t, its coefficient c_k
    and its own trained model of the previous round, over every float state entry (BN statistics
    included; integers copied). With Σc = 1 it is the leave-one-out aggregate Σ_{j≠k} c_j θ_j / (1 - c_k).
    Its Dice d_k^t on the client's **validation** split (the run's selection metric) is asked for by the
    server after local training (``Server.query``/``Client.answer``; the minus model only depends on
    what the client held before training); d_k at round 1 is 0;
  * s_k = 1 - mean_{τ<=t} d_k^τ (the round-1 zero stays in the mean);
  * local training from θ^t, update g_k = θ_k^t - θ^t.
Server:
  * G = Σ_j p_j g_j on trainable parameters; cos_k = cos(g_k, G - p_k g_k); a_k = 1 - mean_τ cos_k^τ.
    The prior p (``prior``): ``uniform`` (default) p = 1/K in every round, as the 2023 code
    (``fedce_assembler.py`` sets its coefficient record to 1/K at round 0 and never writes the new
    coefficients back into it); ``previous``: p = last round's coefficients (uniform in round 1), as
    the 2026 refactor (NVFlare 2.9, ``nvflare/app_opt/pt/fedce.py``) and methods.md §2.14 step 1. The
    FedCE paper text is not among this project's sources, so the default is the 2023 official code
    this module follows; the two priors give coefficients that differ by up to ~2e-3 after 3
    rounds (an audit's measurement), more with more rounds;
  * a and s each normalised to sum 1 then clipped at >= 1e-3;
  * ``combine: sum`` (FedCE (Sum.), NVFlare "plus"): c ∝ a + s; ``multi`` (FedCE (Multi.), "times"):
    c ∝ a·s; normalised, then clipped at >= 1e-3 without renormalising (as the 2023 code);
  * θ^{t+1} = θ^t + Σ_k c_k g_k over every float key (buffers included); num_batches_tracked: max.
Degenerate cases, as the 2026 refactor instead of the 2023 code's 0/0: a zero-norm vector has cosine
0, and a vector a or s that sums to 0 (e.g. identical updates: every cos = 1, a = 0) becomes uniform.
"""

from __future__ import annotations

import math

import torch

from fedmedbench.fl import client, server
from fedmedbench.fl.evaluation import evaluate
from fedmedbench.ops.aggregate import parameter_keys

DEFAULTS = {"combine": "sum", "min_weight": 1.0e-3, "prior": "uniform"}
# Ranges and choices of the parameters (their types come from DEFAULTS): checked at DAG time.
PARAM_SCHEMA = {
    "combine": {"enum": ["sum", "multi"]},
    "min_weight": {"type": "number", "minimum": 0, "maximum": 1},
    "prior": {"enum": ["uniform", "previous"]},  # the consensus weights of the cosine (see the docstring)
}
PERSONALIZED = False


def minus_model(global_state: dict, own_state: dict, coefficient: float) -> dict:
    """(θ^t - c θ_k) / (1 - c) for float entries; integer entries are copied from θ^t."""
    out = {}
    for key, value in global_state.items():
        if value.is_floating_point():
            out[key] = (value - coefficient * own_state[key].to(value.device)) / (1.0 - coefficient)
        else:
            out[key] = value.clone()
    return out


def normalise_clip(values: list[float], floor: float) -> list[float]:
    """Normalise to sum 1 (uniform when the sum is 0), then clip at >= floor."""
    total = math.fsum(values)
    if not total > 0:
        values, total = [1.0] * len(values), float(len(values))
    return [max(v / total, floor) for v in values]


def combine_contributions(a: list[float], s: list[float], mode: str, floor: float) -> list[float]:
    a, s = normalise_clip(a, floor), normalise_clip(s, floor)
    if mode == "sum":
        raw = [x + y for x, y in zip(a, s)]
    elif mode == "multi":
        raw = [x * y for x, y in zip(a, s)]
    else:
        raise ValueError(f"fedce: combine must be 'sum' or 'multi', got {mode!r}")
    return normalise_clip(raw, floor)


def cosine(u: torch.Tensor, v: torch.Tensor) -> float:
    nu, nv = float(u.norm()), float(v.norm())
    return float(u @ v) / (nu * nv) if nu > 0 and nv > 0 else 0.0


class Client(client.Client):
    def __init__(self, cfg, index, data, model, generator, device):
        super().__init__(cfg, index, data, model, generator, device)
        self.previous = None  # θ_k^{t-1}: this client's trained model of the last round
        self.minus_dice: list[float] = []

    def answer(self, query):
        if query["coefficient"] is None or self.previous is None:
            dice = 0.0
        else:
            trained = self.model.state_dict()
            trained = {k: v.clone() for k, v in trained.items()}
            self.model.load_state_dict(minus_model(query["global"], self.previous, query["coefficient"]))
            dice = evaluate(self.model, self.data.val, self.cfg, self.device)[self.cfg.selection_metric]
            self.model.load_state_dict(trained)
        self.minus_dice.append(float(dice))
        self.previous = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        return {"score": 1.0 - sum(self.minus_dice) / len(self.minus_dice)}

    def state_dict(self):
        return {**super().state_dict(), "previous": self.previous, "minus_dice": self.minus_dice}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.previous, self.minus_dice = state["previous"], state["minus_dice"]


class Server(server.Server):
    def __init__(self, cfg, model, num_clients):
        super().__init__(cfg, model, num_clients)
        self.param_keys = parameter_keys(model)
        self.coefficients = [1.0 / num_clients] * num_clients
        self.cosine_history: list[list[float]] = [[] for _ in range(num_clients)]
        self.last_log = {}

    def query(self, round_index, replies):
        first = round_index == 1
        return [{"global": self.global_state, "coefficient": None if first else c} for c in self.coefficients]

    def aggregate(self, round_index, replies):
        states = [r["state"] for r in replies]
        keys = sorted(set.intersection(*(set(s) for s in states)))
        device = states[0][keys[0]].device
        base = {k: self.global_state[k].to(device) for k in keys}
        floats = [k for k in keys if base[k].is_floating_point()]
        updates = [{k: s[k] - base[k] for k in floats} for s in states]
        params = [k for k in floats if k in self.param_keys]
        flat = [torch.cat([u[k].flatten().double() for k in params]) for u in updates]
        # The consensus direction's weights: 1/K (2023 code) or the coefficients that built θ^t (refactor).
        prior = [1.0 / len(flat)] * len(flat) if self.params["prior"] == "uniform" else self.coefficients
        consensus = sum(p * f for p, f in zip(prior, flat))
        for i, f in enumerate(flat):
            self.cosine_history[i].append(cosine(f, consensus - prior[i] * f))
        a = [1.0 - sum(h) / len(h) for h in self.cosine_history]
        s = [float(r["answer"]["score"]) for r in replies]
        floor = self.params["min_weight"]
        self.coefficients = combine_contributions(a, s, self.params["combine"], floor)
        for k in keys:
            if k in floats:
                total = base[k]
                for c, u in zip(self.coefficients, updates):
                    total = total + c * u[k]
                self.global_state[k] = total
            else:
                self.global_state[k] = torch.stack([s[k] for s in states]).max(dim=0).values
        self.last_log = {
            i: {"coefficient": self.coefficients[i], "gradient_contribution": a[i], "minus_model_score": s[i]}
            for i in range(len(replies))
        }

    def round_log(self, round_index):
        return self.last_log

    def state_dict(self):
        return {**super().state_dict(), "coefficients": self.coefficients, "cosine_history": self.cosine_history}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.coefficients, self.cosine_history = state["coefficients"], state["cosine_history"]


__all__ = ["Client", "Server", "DEFAULTS", "PERSONALIZED", "minus_model", "combine_contributions"]
