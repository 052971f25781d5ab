"""HarmoFL: the ablation with both parts off is FedAvg bit for bit; the amplitude protocol (running
average in round 1, server mean, fixed global amplitude for training and evaluation); resume."""

import io

import pytest
import torch

from fedmedbench.fl import engine
from fedmedbench.fl.data import train_batches
from fedmedbench.methods import harmofl
from fedmedbench.ops.fourier import amplitude_normalize, batch_mean_amplitude, update_running_amplitude
from tests.conftest import assert_same_models, build_federation, interrupt_after_round, strip, tiny_run_config, train

OFF = {"amp_norm": False, "weight_perturbation": False}


def test_both_parts_off_is_fedavg_bit_for_bit(tmp_path, tiny_task):
    store, split = tiny_task
    fedavg = train(tmp_path, "fedavg", tiny_run_config(store, split, "fedavg"))
    off = train(tmp_path, "off", tiny_run_config(store, split, "harmofl", method_params=OFF))
    assert strip(fedavg[0]) == strip(off[0])
    assert fedavg[2] == off[2]  # every round's numbers
    assert_same_models(fedavg[1], off[1])
    # ... while each part alone changes the training (so the test can fail).
    for name, params in [("ampnorm", {"weight_perturbation": False}), ("wp", {"amp_norm": False})]:
        assert (
            train(tmp_path, name, tiny_run_config(store, split, "harmofl", rounds=2, method_params=params))[2]
            != fedavg[2]
        )


def test_harmofl_learns_the_tiny_task(tmp_path, tiny_task):
    store, split = tiny_task
    final, best, _ = train(tmp_path, "harmofl", tiny_run_config(store, split, "harmofl", rounds=10, augment="none"))
    mean_fg = sum(v["dice_fg"] for v in final["val"].values()) / 3
    assert mean_fg > 0.5, final["val"]
    # One global model, evaluated through AmpNorm with the one global amplitude.
    assert best["models"]["diffs"] == {"B": {}, "C": {}}
    assert "amplitude" in best["models"]["base"] and "net.head.weight" in best["models"]["base"]
    assert best["models"]["base"]["amplitude"].shape == (3, 16, 16)


def make_federation(store, split, params):
    cfg = tiny_run_config(store, split, "harmofl", augment="none")
    cfg, _, server, clients = build_federation(harmofl, {**cfg, "method_params": params})
    return cfg, server, clients


def run_round(server, clients, round_index):
    replies = []
    for c in clients:
        c.train(1)
        replies.append(c.reply())
    server.aggregate(round_index, replies)
    for c in clients:
        c.receive(server.package(c.index, round_index))
    return replies


def expected_running_amplitude(client, cfg, mode, decay, init):
    """Eq. 3 by hand over the batches the client is about to see (same generator state)."""
    generator = torch.Generator()
    generator.set_state(client.generator.get_state())
    running = None
    for x, _ in train_batches(client.data.train, cfg.batch_size, generator, cfg.augment, cfg.intensity_scale):
        running = update_running_amplitude(running, batch_mean_amplitude(x, mode), decay, init)
    return running


@pytest.mark.parametrize("params", [{}, {"amplitude_init": "zero", "weight_perturbation": False}])
def test_amplitude_protocol(tiny_task, params):
    store, split = tiny_task
    cfg, server, clients = make_federation(store, split, params)
    init = params.get("amplitude_init", "first_batch")
    assert server.package(0, 0).get("amplitude") is None
    expected = [expected_running_amplitude(c, cfg, "full", 0.1, init) for c in clients]

    replies = run_round(server, clients, 1)
    for reply, amp in zip(replies, expected):
        torch.testing.assert_close(reply["amplitude"], amp, rtol=1e-6, atol=1e-5)  # round 1: own running average
    global_amplitude = (replies[0]["amplitude"] + replies[1]["amplitude"] + replies[2]["amplitude"]) / 3  # 1/N
    torch.testing.assert_close(server.global_amplitude, global_amplitude, rtol=1e-6, atol=1e-6)
    for c in clients:
        assert torch.equal(c.global_amplitude, server.global_amplitude)

    # Round 2 and later: training batches use the fixed global amplitude; nothing more goes up.
    own, fixed = [c.own_amplitude.clone() for c in clients], server.global_amplitude.clone()
    seen = []
    clients[0].loss = lambda x, y, c=clients[0]: (seen.append(x.clone()), harmofl.Client.loss(c, x, y))[1]
    generator = torch.Generator()
    generator.set_state(clients[0].generator.get_state())
    raw = [x for x, _ in train_batches(clients[0].data.train, cfg.batch_size, generator, "none", cfg.intensity_scale)]
    replies = run_round(server, clients, 2)
    assert all("amplitude" not in r for r in replies)
    assert torch.equal(server.global_amplitude, fixed)
    assert all(torch.equal(c.own_amplitude, o) for c, o in zip(clients, own))
    assert torch.equal(seen[0], amplitude_normalize(raw[0], server.global_amplitude))

    # Evaluation: AmpNorm with the global amplitude, then the network.
    wrapped = clients[1].eval_model()
    x = torch.rand(2, 3, 16, 16)
    wrapped.eval()
    assert torch.equal(wrapped(x), clients[1].model(amplitude_normalize(x, server.global_amplitude)))
    assert wrapped.embed(x).shape == (2, 32)


def test_official_code_switch_freezes_the_first_batch_dc_amplitude(tiny_task):
    store, split = tiny_task
    cfg, server, clients = make_federation(
        store, split, {"official_code": True, "amplitude_mode": "full", "amplitude_decay": 0.1}
    )
    generator = torch.Generator()
    generator.set_state(clients[0].generator.get_state())
    first_batch = next(train_batches(clients[0].data.train, cfg.batch_size, generator, "none", cfg.intensity_scale))[0]
    replies = run_round(server, clients, 1)
    dc = first_batch.sum(dim=(-2, -1), keepdim=True).abs().mean(dim=0)
    assert replies[0]["amplitude"].shape == (3, 1, 1)
    assert torch.equal(replies[0]["amplitude"], dc)  # frozen after the first batch (momentum 0.1 -> int 0)
    assert clients[0].eval_model().mode == "dc"


def roundtrip(state):
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)  # what the engine's checkpoints allow


def test_state_dict_round_trip_resumes_identically(tiny_task):
    store, split = tiny_task
    _, server, clients = make_federation(store, split, {})
    run_round(server, clients, 1)
    saved_server, saved_clients = roundtrip(server.state_dict()), [roundtrip(c.state_dict()) for c in clients]
    _, server2, clients2 = make_federation(store, split, {})
    server2.load_state_dict(saved_server)
    for c, s in zip(clients2, saved_clients):
        c.load_state_dict(s)
    run_round(server, clients, 2)
    run_round(server2, clients2, 2)
    for c, c2 in zip(clients, clients2):
        assert torch.equal(c.global_amplitude, c2.global_amplitude) and torch.equal(c.own_amplitude, c2.own_amplitude)
        for key, value in c.model.state_dict().items():
            assert torch.equal(value, c2.model.state_dict()[key]), key


def test_killed_after_round_one_resumes_to_the_same_result(tmp_path, tiny_task, monkeypatch):
    store, split = tiny_task
    cfg = tiny_run_config(store, split, "harmofl", rounds=3)
    straight = engine.run_training(cfg, tmp_path / "straight", progress=False)

    interrupt_after_round(cfg, tmp_path / "resumed", monkeypatch)
    resumed = engine.run_training(cfg, tmp_path / "resumed", progress=False)
    assert strip(straight) == strip(resumed)
    assert (tmp_path / "straight" / "history.csv").read_text() == (tmp_path / "resumed" / "history.csv").read_text()
