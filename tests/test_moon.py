"""MOON: the contrastive loss by hand, mu = 0 is FedAvg bit for bit, the head is trained and averaged."""

import copy
import math

import pytest
import torch

from fedmedbench.fl import checkpoint
from fedmedbench.fl.data import train_batches
from fedmedbench.fl.engine import run_training
from fedmedbench.fl.seeding import client_generator
from fedmedbench.methods import fedavg, moon
from fedmedbench.models import build_model
from tests.conftest import build_federation, interrupt_after_round, tiny_run_config


# --- the loss --------------------------------------------------------------------------------------
def test_contrastive_loss_by_hand():
    z = torch.tensor([[1.0, 0.0], [0.0, 2.0]], dtype=torch.float64)
    z_g = torch.tensor([[1.0, 1.0], [0.0, 1.0]], dtype=torch.float64)
    z_p = torch.tensor([[0.0, 1.0], [3.0, 0.0]], dtype=torch.float64)
    # sample 1: s_g = 1/sqrt(2), s_p = 0; sample 2: s_g = 1, s_p = 0. T = 0.5.
    # l = log(1 + e^{(s_p - s_g)/T}): log(1 + e^{-sqrt 2}) = 0.2176..., log(1 + e^{-2}) = 0.1269...
    expected = (math.log(1 + math.exp(-math.sqrt(2))) + math.log(1 + math.exp(-2.0))) / 2
    assert expected == pytest.approx((0.2176 + 0.1269) / 2, abs=1e-4)
    loss = moon.contrastive_loss(z, z_g, z_p, 0.5)
    assert loss.item() == pytest.approx(expected, rel=1e-12)
    assert loss.item() >= 0
    # temperature 1: log(1 + e^{-1/sqrt 2}) for the first sample alone
    assert moon.contrastive_loss(z[:1], z_g[:1], z_p[:1], 1.0).item() == pytest.approx(
        math.log(1 + math.exp(-1 / math.sqrt(2))), rel=1e-12
    )


def test_contrastive_loss_is_log2_with_zero_gradient_when_prev_equals_global():
    z = torch.randn(5, 8, dtype=torch.float64, requires_grad=True)
    other = torch.randn(5, 8, dtype=torch.float64)
    loss = moon.contrastive_loss(z, other, other, 0.5)
    loss.backward()
    assert loss.item() == pytest.approx(math.log(2), rel=1e-12)
    assert z.grad.abs().max().item() < 1e-15


# --- the head -------------------------------------------------------------------------------------
def test_head_shape_seed_and_no_global_rng_use():
    model = build_model({"name": "unet", "init_features": 2})
    before = torch.get_rng_state()
    head = moon.build_head(model, moon.DEFAULTS, seed=3)
    assert torch.equal(torch.get_rng_state(), before)
    assert [tuple(p.shape) for p in head.parameters()] == [(32, 32), (32,), (256, 32), (256,)]
    again, other = moon.build_head(model, moon.DEFAULTS, seed=3), moon.build_head(model, moon.DEFAULTS, seed=4)
    assert all(torch.equal(a, b) for a, b in zip(head.parameters(), again.parameters()))
    assert not torch.equal(head[0].weight, other[0].weight)
    assert moon.DEFAULTS == {"mu": 1.0, "temperature": 0.5, "projection_dim": 256}


# --- whole runs ------------------------------------------------------------------------------------
def train(tmp_path, name, cfg):
    final = run_training(cfg, tmp_path / name, progress=False)
    return (
        final,
        checkpoint.load_plain(tmp_path / name / "model_best.pt"),
        (tmp_path / name / "history.csv").read_text(),
    )


def test_mu_zero_is_fedavg_bitwise(tmp_path, tiny_task):
    store, split = tiny_task
    avg = train(tmp_path, "fedavg", tiny_run_config(store, split, "fedavg", rounds=2))
    zero = train(tmp_path, "moon0", tiny_run_config(store, split, "moon", rounds=2, method_params={"mu": 0.0}))
    assert zero[2] == avg[2]  # every round's numbers
    assert zero[0]["test"] == avg[0]["test"] and zero[0]["val"] == avg[0]["val"]
    assert zero[1]["models"]["base"].keys() == avg[1]["models"]["base"].keys()  # the head is not in the evaluated model
    for key, value in avg[1]["models"]["base"].items():
        assert torch.equal(zero[1]["models"]["base"][key], value), key
    # ... and a real contrastive term changes the training (so this test can fail)
    strong = train(tmp_path, "moon5", tiny_run_config(store, split, "moon", rounds=2, method_params={"mu": 5.0}))
    assert strong[2] != avg[2]


def federation(store, split, cfg):
    return build_federation(moon, cfg)


def test_head_is_trained_and_averaged(tiny_task):
    store, split = tiny_task
    _, _, server, clients = federation(
        store, split, tiny_run_config(store, split, "moon", augment="none", method_params={"mu": 1.0})
    )
    init = {k: v.clone() for k, v in server.global_state.items() if k.startswith(moon.HEAD_PREFIX)}
    assert len(init) == 4 and all(
        torch.equal(v, clients[1].head.state_dict()[k[len(moon.HEAD_PREFIX) :]]) for k, v in init.items()
    )
    for round_index in (1, 2):  # round 1 has no previous model (l_con = 0), round 2 trains the head
        replies = []
        for c in clients:
            c.train(1)
            replies.append(c.reply())
        server.aggregate(round_index, replies)
        for c in clients:
            c.receive(server.package(c.index, round_index))
        # (round 1: the average of identical heads, equal up to rounding)
        heads_moved = not all(torch.allclose(server.global_state[k], v, rtol=0, atol=1e-6) for k, v in init.items())
        assert heads_moved == (round_index == 2)
    for c in clients:  # every client holds the averaged head, and the frozen global copy matches it
        for k, v in c.head.state_dict().items():
            assert torch.equal(v, server.global_state[moon.HEAD_PREFIX + k])
            assert torch.equal(c.global_head.state_dict()[k], v)
        assert not c.global_net.training and not c.prev_net.training
        assert not any(p.requires_grad for p in c.prev_net.parameters())


def test_embedding_pass_does_not_touch_bn_statistics(tiny_task):
    """One MOON step (mu > 0) updates the BN running statistics exactly as one FedAvg step does."""
    store, split = tiny_task
    cfg, model, _, (client, *_) = federation(
        store, split, tiny_run_config(store, split, "moon", augment="none", method_params={"mu": 1.0})
    )
    client.has_prev = True  # pretend a previous round, so the contrastive term is on
    plain = fedavg.Client(cfg, 0, client.data, copy.deepcopy(model), client_generator(0, 0), torch.device("cpu"))
    x, y = next(train_batches(client.data.train, 4, torch.Generator().manual_seed(0), "none", cfg.intensity_scale))
    for c in (client, plain):
        c.model.train()
        c.train_step(x, y)
    ours, theirs = client.model.state_dict(), plain.model.state_dict()
    for key in (k for k, _ in model.named_buffers()):
        assert torch.equal(ours[key], theirs[key]), key
    assert not torch.equal(ours["encoders.0.0.weight"], theirs["encoders.0.0.weight"])  # but the step differs
    assert client.head[0].weight.grad is not None


def test_resume_is_exact(tmp_path, tiny_task, monkeypatch):
    store, split = tiny_task
    cfg = tiny_run_config(store, split, "moon", rounds=2, method_params={"mu": 1.0})
    straight = run_training(cfg, tmp_path / "straight", progress=False)
    interrupt_after_round(cfg, tmp_path / "resumed", monkeypatch)
    resumed = run_training(cfg, tmp_path / "resumed", progress=False)
    assert straight == resumed
    assert (tmp_path / "straight" / "history.csv").read_text() == (tmp_path / "resumed" / "history.csv").read_text()
