"""FedNova: normalizers, the hand-computed two-client rule, equal tau_i = FedAvg, resume."""

import logging
import math

import pytest
import torch
from torch import nn

from fedmedbench.fl import checkpoint
from fedmedbench.fl.engine import run_training
from fedmedbench.methods import fedavg, fednova
from tests.conftest import interrupt_after_round, tiny_run_config, toy_run_config


# --- normalizer ----------------------------------------------------------------------------------
def test_normalizer_closed_forms():
    assert fednova.normalizer(5, lr=0.1) == 5.0
    rho, tau = 0.9, 7
    expected = sum((1 - rho**t) / (1 - rho) for t in range(1, tau + 1))  # sum of the counters c_t
    assert fednova.normalizer(tau, lr=0.1, momentum=rho) == pytest.approx(expected, rel=1e-14)
    assert expected == pytest.approx(23.046721, abs=1e-12)  # 1 + 1.9 + 2.71 + 3.439 + 4.0951 + 4.68559 + 5.217031
    lr, mu = 0.1, 0.5
    assert fednova.normalizer(tau, lr=lr, mu=mu) == pytest.approx((1 - (1 - lr * mu) ** tau) / (lr * mu), rel=1e-14)
    assert fednova.normalizer(0, lr=0.1, momentum=0.9) == 0.0


def measured_coefficients(tau, lr, momentum, mu):
    """a_s measured with torch's SGD: a unit gradient at step s only (plus the proximal gradient
    mu (w - w^t) at every step, added to .grad as the client does); a_s = (w^t - w_tau) / lr."""
    coefficients = []
    for s in range(tau):
        w = nn.Parameter(torch.zeros(1, dtype=torch.float64))
        opt = torch.optim.SGD([w], lr=lr, momentum=momentum)
        for step in range(tau):
            opt.zero_grad()
            w.grad = torch.full_like(w, 1.0 if step == s else 0.0) + mu * w.detach()
            opt.step()
        coefficients.append(float(-w.detach()) / lr)
    return coefficients


@pytest.mark.parametrize(("momentum", "mu"), [(0.0, 0.0), (0.9, 0.0), (0.0, 0.3), (0.9, 0.3), (0.5, 2.0)])
def test_normalizer_matches_torch_sgd(momentum, mu):
    tau, lr = 9, 0.2
    a = measured_coefficients(tau, lr, momentum, mu)
    assert fednova.normalizer(tau, lr, momentum, mu) == pytest.approx(sum(abs(x) for x in a), rel=1e-12)


# --- server rule on hand-made replies --------------------------------------------------------------
class Toy(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.tensor([1.0, 2.0], dtype=torch.float64))
        self.register_buffer("stat", torch.tensor([0.0], dtype=torch.float64))
        self.register_buffer("count", torch.tensor(0))


def toy_cfg(weighting="uniform", optimizer=None, reset_optimizer_each_round=False, **params):
    return toy_run_config(
        optimizer=optimizer or {"name": "sgd", "lr": 0.1},
        aggregation={"weighting": weighting},
        reset_optimizer_each_round=reset_optimizer_each_round,
        method_params={**fednova.DEFAULTS, **params},
    )


def reply(w, stat, count, steps, n):
    state = {
        "w": torch.tensor(w, dtype=torch.float64),
        "stat": torch.tensor([stat], dtype=torch.float64),
        "count": torch.tensor(count),
    }
    return {"state": state, "num_samples": n, "steps": steps, "normalizer": float(steps)}


@pytest.mark.parametrize(
    ("weighting", "expected_w", "expected_stat"), [("uniform", [0.7, 2.0], 2.0), ("samples", [0.9375, 1.75], 2.5)]
)
def test_two_clients_with_unequal_tau_by_hand(weighting, expected_w, expected_stat):
    # w^t = (1, 2). Client 1: tau 2, Delta = (-0.4, 0.2); client 2: tau 6, Delta = (0.3, -0.6).
    # d_1 = (w^t - w_1)/2 = (0.2, -0.1), d_2 = (-0.05, 0.1).
    # uniform: tau_eff = 4, sum p d = (0.075, 0) -> w = (1 - 0.3, 2) = (0.7, 2.0)   [FedAvg: (0.95, 1.8)]
    # samples (n = 1, 3): tau_eff = 0.5 + 4.5 = 5, sum p d = (0.0125, 0.05) -> (0.9375, 1.75)
    server = fednova.Server(toy_cfg(weighting), Toy(), 2)
    server.aggregate(1, [reply([0.6, 2.2], 1.0, 3, steps=2, n=1), reply([1.3, 1.4], 3.0, 5, steps=6, n=3)])
    assert torch.allclose(server.global_state["w"], torch.tensor(expected_w, dtype=torch.float64), rtol=0, atol=1e-15)
    # buffers: plain weighted average (not normalized), integer counters: max
    assert server.global_state["stat"].item() == pytest.approx(expected_stat, abs=1e-15)
    assert server.global_state["count"].item() == 5


def test_server_momentum_by_hand():
    # gmf 0.5, lr 0.1. Round 1: plain FedNova gives (0.7, 2); b = (w - new)/lr = (3, 0); w = w - lr b = (0.7, 2).
    # Round 2 (same Deltas around (0.7, 2)): plain (0.4, 2); b = 0.5 (3, 0) + (3, 0) = (4.5, 0); w = (0.25, 2).
    server = fednova.Server(toy_cfg(server_momentum=0.5), Toy(), 2)
    server.aggregate(1, [reply([0.6, 2.2], 1.0, 0, steps=2, n=1), reply([1.3, 1.4], 3.0, 0, steps=6, n=1)])
    assert torch.allclose(server.global_state["w"], torch.tensor([0.7, 2.0], dtype=torch.float64), rtol=0, atol=1e-14)
    server.aggregate(2, [reply([0.3, 2.2], 1.0, 0, steps=2, n=1), reply([1.0, 1.4], 3.0, 0, steps=6, n=1)])
    assert torch.allclose(server.global_state["w"], torch.tensor([0.25, 2.0], dtype=torch.float64), rtol=0, atol=1e-13)
    assert torch.allclose(
        server.state_dict()["momentum_buffer"]["w"], torch.tensor([4.5, 0.0], dtype=torch.float64), atol=1e-12
    )


def test_equal_normalizers_give_fedavg_bitwise_on_replies():
    replies = [
        reply([0.6, 2.2], 1.0, 3, steps=4, n=1),
        reply([1.3, 1.4], 3.0, 5, steps=4, n=3),
        reply([0.1, -0.7], 2.0, 1, steps=4, n=2),
    ]
    for r in replies:
        r["normalizer"] = fednova.normalizer(4, 0.1, momentum=0.9)
    for weighting in ("uniform", "samples"):
        nova, avg = fednova.Server(toy_cfg(weighting), Toy(), 3), fedavg.Server(toy_cfg(weighting), Toy(), 3)
        nova.aggregate(1, replies)
        avg.aggregate(1, replies)
        for key in avg.global_state:
            assert torch.equal(nova.global_state[key], avg.global_state[key]), (weighting, key)


# --- whole runs ------------------------------------------------------------------------------------
def train(tmp_path, name, cfg):
    final = run_training(cfg, tmp_path / name, progress=False)
    return (
        final,
        checkpoint.load_plain(tmp_path / name / "model_best.pt"),
        (tmp_path / name / "history.csv").read_text(),
    )


def same_models(a, b):
    return a["models"]["base"].keys() == b["models"]["base"].keys() and all(
        torch.equal(a["models"]["base"][k], b["models"]["base"][k]) for k in a["models"]["base"]
    )


SGD_MOMENTUM = {"name": "sgd", "lr": 0.05, "momentum": 0.9, "weight_decay": 1e-4}


@pytest.mark.parametrize("optimizer", [None, SGD_MOMENTUM], ids=["adam", "sgd_momentum"])
def test_equal_tau_is_fedavg_bitwise(tmp_path, tiny_task, caplog, optimizer):
    store, split = tiny_task
    overrides = {"truncate_to_smallest": True, "batch_size": 2, "rounds": 2}  # every client: 4 samples, 2 steps
    if optimizer:
        overrides.update(optimizer=optimizer, reset_optimizer_each_round=True)
    with caplog.at_level(logging.WARNING, logger="fedmedbench.methods.fednova"):
        nova = train(tmp_path, "fednova", tiny_run_config(store, split, "fednova", **overrides))
    avg = train(tmp_path, "fedavg", tiny_run_config(store, split, "fedavg", **overrides))
    assert nova[2] == avg[2] and nova[0]["test"] == avg[0]["test"]
    assert same_models(nova[1], avg[1])
    fallback = [r for r in caplog.records if "falling back to a_i = tau_i" in r.getMessage()]
    assert len(fallback) == (0 if optimizer else 1)


def test_momentum_warning_when_optimizer_persists(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="fedmedbench.methods.fednova"):
        fednova.Server(toy_cfg(optimizer=SGD_MOMENTUM, reset_optimizer_each_round=False), Toy(), 2)
    assert any("carries over" in r.getMessage() for r in caplog.records)


def test_resume_is_exact(tmp_path, tiny_task, monkeypatch):
    store, split = tiny_task
    cfg = tiny_run_config(
        store,
        split,
        "fednova",
        rounds=2,
        optimizer=SGD_MOMENTUM,
        method_params={"server_momentum": 0.5, "proximal_mu": 0.1},
    )
    straight = run_training(cfg, tmp_path / "straight", progress=False)
    interrupt_after_round(cfg, tmp_path / "resumed", monkeypatch)
    assert checkpoint.load(tmp_path / "resumed" / "checkpoint.pt")["server"]["momentum_buffer"]
    resumed = run_training(cfg, tmp_path / "resumed", progress=False)
    assert straight == resumed
    assert (tmp_path / "straight" / "history.csv").read_text() == (tmp_path / "resumed" / "history.csv").read_text()
    assert math.isfinite(straight["val"]["A"]["dice_paper"])
