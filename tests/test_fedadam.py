"""FedAdam: the server rule by hand, its FedAvg limit, buffers averaged, resume."""

import math

import pytest
import torch
from torch import nn

from fedmedbench.fl import checkpoint
from fedmedbench.fl.engine import run_training
from fedmedbench.methods import fedadam, fedavg
from tests.conftest import interrupt_after_round, tiny_run_config, toy_run_config

W0 = [0.5, -1.0, 2.0]


class Toy(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.tensor(W0, dtype=torch.float64))
        self.register_buffer("stat", torch.tensor([0.0], dtype=torch.float64))
        self.register_buffer("count", torch.tensor(0))


def toy_server(weighting="uniform", **params):
    cfg = toy_run_config(aggregation={"weighting": weighting}, method_params={**fedadam.DEFAULTS, **params})
    return fedadam.Server(cfg, Toy(), 2)


def replies_around(w, deltas, stats=(1.0, 3.0), counts=(2, 7), n=(1, 1)):
    out = []
    for delta, stat, count, samples in zip(deltas, stats, counts, n):
        state = {
            "w": torch.tensor(w, dtype=torch.float64) + torch.tensor(delta, dtype=torch.float64),
            "stat": torch.tensor([stat], dtype=torch.float64),
            "count": torch.tensor(count),
        }
        out.append({"state": state, "num_samples": samples, "steps": 3})
    return out


def test_defaults():
    assert fedadam.DEFAULTS == {"server_lr": 1e-3, "beta1": 0.9, "beta2": 0.99, "tau": 1e-3}
    server = toy_server()
    assert torch.equal(server.m["w"], torch.zeros(3, dtype=torch.float64))
    assert torch.equal(server.v["w"], torch.full((3,), 1e-6, dtype=torch.float64))  # v_{-1} = tau^2
    assert set(server.m) == {"w"}  # parameters only


def test_one_and_two_steps_by_hand():
    server = toy_server(server_lr=0.1)
    # Client deltas (uniform p): Delta_t = mean = (0.002, -0.0005, 0).
    server.aggregate(1, replies_around(W0, [[0.003, 0.0, 0.001], [0.001, -0.001, -0.001]]))
    # m1 = 0.1 Delta = (2e-4, -5e-5, 0); v1 = 0.99e-6 + 0.01 Delta^2 = (1.03e-6, 0.9925e-6, 0.99e-6)
    m1 = [2e-4, -5e-5, 0.0]
    v1 = [1.03e-6, 0.9925e-6, 0.99e-6]
    w1 = [w + 0.1 * m / (math.sqrt(v) + 1e-3) for w, m, v in zip(W0, m1, v1)]
    assert w1[0] == pytest.approx(0.50992610434, abs=1e-11)  # 0.5 + 0.1 * 2e-4 / (1.0148892e-3 + 1e-3)
    assert torch.allclose(server.global_state["w"], torch.tensor(w1, dtype=torch.float64), rtol=0, atol=1e-15)
    assert torch.allclose(server.m["w"], torch.tensor(m1, dtype=torch.float64), rtol=1e-10, atol=1e-16)
    assert torch.allclose(server.v["w"], torch.tensor(v1, dtype=torch.float64), rtol=1e-10, atol=0)
    # Buffers are the plain average (never passed through Adam), counters the max.
    assert server.global_state["stat"].item() == 2.0 and server.global_state["count"].item() == 7

    # Round 2, Delta_t = (-0.001, 0, 0.004): m2 = 0.9 m1 + 0.1 Delta, v2 = 0.99 v1 + 0.01 Delta^2.
    server.aggregate(2, replies_around(w1, [[-0.001, 0.0, 0.004], [-0.001, 0.0, 0.004]]))
    delta = [-0.001, 0.0, 0.004]
    m2 = [0.9 * m + 0.1 * d for m, d in zip(m1, delta)]
    v2 = [0.99 * v + 0.01 * d * d for v, d in zip(v1, delta)]
    w2 = [w + 0.1 * m / (math.sqrt(v) + 1e-3) for w, m, v in zip(w1, m2, v2)]
    assert torch.allclose(server.global_state["w"], torch.tensor(w2, dtype=torch.float64), rtol=0, atol=1e-15)


def test_zero_delta_and_sign_flip():
    still = toy_server(server_lr=0.1)
    still.aggregate(1, replies_around(W0, [[0.0] * 3, [0.0] * 3]))
    assert torch.equal(still.global_state["w"], torch.tensor(W0, dtype=torch.float64))
    up, down = toy_server(server_lr=0.1), toy_server(server_lr=0.1)
    up.aggregate(1, replies_around(W0, [[0.01, -0.02, 0.003]] * 2))
    down.aggregate(1, replies_around(W0, [[-0.01, 0.02, -0.003]] * 2))
    w0 = torch.tensor(W0, dtype=torch.float64)
    assert torch.allclose(up.global_state["w"] - w0, -(down.global_state["w"] - w0), rtol=1e-12, atol=0)


def test_fedavg_limit_on_replies():
    """beta1 = 0, eta = tau = T -> inf: w + T Delta / (|Delta| + T) -> w + Delta. With v_{-1} = tau^2
    also beta2 = 0 (else sqrt(v) ~ sqrt(beta2) T and the step tends to Delta / (1 + sqrt(beta2)))."""
    T = 1e8
    replies = replies_around(W0, [[0.003, 0.2, 0.001], [0.001, -0.001, -0.05]], n=(1, 3))
    avg = fedavg.Server(toy_run_config(aggregation={"weighting": "samples"}), Toy(), 2)
    avg.aggregate(1, replies)
    adam = toy_server("samples", server_lr=T, tau=T, beta1=0.0, beta2=0.0)
    adam.aggregate(1, replies)
    assert torch.allclose(adam.global_state["w"], avg.global_state["w"], rtol=1e-7, atol=0)
    assert not torch.equal(adam.global_state["w"], avg.global_state["w"])  # a limit, not an identity
    damped = toy_server("samples", server_lr=T, tau=T, beta1=0.0, beta2=0.99)
    damped.aggregate(1, replies)
    w0 = torch.tensor(W0, dtype=torch.float64)
    assert torch.allclose(
        damped.global_state["w"] - w0, (avg.global_state["w"] - w0) / (1 + math.sqrt(0.99)), rtol=1e-7
    )


def test_fedavg_limit_whole_run(tmp_path, tiny_task):
    store, split = tiny_task
    T = 1e8
    adam = run_training(
        tiny_run_config(
            store, split, "fedadam", rounds=2, method_params={"server_lr": T, "tau": T, "beta1": 0.0, "beta2": 0.0}
        ),
        tmp_path / "adam",
        progress=False,
    )
    avg = run_training(tiny_run_config(store, split, "fedavg", rounds=2), tmp_path / "avg", progress=False)
    a, b = (checkpoint.load_plain(tmp_path / name / "model_best.pt")["models"]["base"] for name in ("adam", "avg"))
    for key in b:
        assert torch.allclose(a[key].double(), b[key].double(), rtol=1e-4, atol=1e-5), key
    for client in avg["test"]:
        assert adam["test"][client]["dice_paper"] == pytest.approx(avg["test"][client]["dice_paper"], abs=1e-3)


def test_resume_is_exact(tmp_path, tiny_task, monkeypatch):
    store, split = tiny_task
    cfg = tiny_run_config(store, split, "fedadam", rounds=2, method_params={"server_lr": 1e-2})
    straight = run_training(cfg, tmp_path / "straight", progress=False)
    interrupt_after_round(cfg, tmp_path / "resumed", monkeypatch)
    saved = checkpoint.load(tmp_path / "resumed" / "checkpoint.pt")["server"]
    assert saved["m"] and any(v.abs().max() > 0 for v in saved["m"].values())
    resumed = run_training(cfg, tmp_path / "resumed", progress=False)
    assert straight == resumed
    assert (tmp_path / "straight" / "history.csv").read_text() == (tmp_path / "resumed" / "history.csv").read_text()
