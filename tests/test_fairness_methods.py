"""Fed-LWR and the fair-FL baselines (q-FedAvg, CFFL, CGSV, Ditto, FedCE): invariants and resume."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from fedmedbench.data.store import write_client, write_split_csv
from fedmedbench.fl.engine import run_training
from fedmedbench.methods import cffl, cgsv, ditto, fedavg, fedce, fedlwr, qfedavg, solo
from fedmedbench.ops.aggregate import parameter_keys, weighted_average
from fedmedbench.ops.cka import hooked_layers
from tests.conftest import build_federation, interrupt_after_round, tiny_run_config


def write_fair_task(root, clients=("A", "B", "C"), count=12, size=16, identical=False):
    """Clients with 4 validation images each (CKA needs >= 4); ``identical``: the same images everywhere."""
    rows = []
    for c, name in enumerate(clients):
        rng = np.random.default_rng(0 if identical else c)
        images = rng.integers(0, 60, (count, size, size, 3), dtype=np.uint8)
        labels = np.zeros((count, size, size), np.uint8)
        for i in range(count):
            y, x = rng.integers(2, size - 8, 2)
            labels[i, y : y + 6, x : x + 6] = 1
            images[i, y : y + 6, x : x + 6] += np.uint8(150 if identical else 120 + 30 * c)
        meta = pd.DataFrame(
            {
                "id": [f"{name}/s{i}" for i in range(count)],
                "group": [f"{name}/c{i % 3}" for i in range(count)],
                "source": "synthetic",
            }
        )
        write_client(root / "store", name, images, labels, meta)
        parts = ["train"] * (count - 6) + ["val"] * 4 + ["test"] * 2
        rows += [
            {"client": name, "split": s, "row": i, "id": f"{name}/s{i}", "group": f"{name}/c{i % 3}"}
            for i, s in enumerate(parts)
        ]
    write_split_csv(pd.DataFrame(rows), root / "split.csv")
    return root / "store", root / "split.csv"


def federation(method, cfg, same_generators=False):
    cfg, model, server, clients = build_federation(method, cfg)
    if same_generators:  # identical clients: same data and the same batch order
        for c in clients[1:]:
            c.generator.set_state(clients[0].generator.get_state())
    return server, clients


def run_rounds(server, clients, rounds, first=1):
    """The engine's round loop without evaluation; returns the last round's replies."""
    for r in range(first, first + rounds):
        replies = []
        for c in clients:
            c.round_index = r
            c.train(c.cfg.local_epochs)
            replies.append(c.reply())
        queries = server.query(r, replies)
        if queries is not None:
            for c, q, reply in zip(clients, queries, replies):
                reply["answer"] = c.answer(q)
        server.aggregate(r, replies)
        for c in clients:
            c.receive(server.package(c.index, r))
    return replies


def params_of(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items() if k in parameter_keys(model)}


def assert_close(a, b, atol=1e-6):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.allclose(a[k].float(), b[k].float(), atol=atol), k


@pytest.fixture()
def identical_task(tmp_path):
    return write_fair_task(tmp_path / "same", identical=True)


@pytest.fixture()
def fair_task(tmp_path):
    return write_fair_task(tmp_path / "fair")


# --- Fed-LWR -----------------------------------------------------------------------------------
def test_fedlwr_identical_clients_get_uniform_weights_and_equal_fedavg(identical_task):
    store, split = identical_task
    cfg = tiny_run_config(store, split, "fedlwr", augment="none")
    server, clients = federation(fedlwr, cfg, same_generators=True)
    run_rounds(server, clients, 2)
    log = server.round_log(2)
    rhos = [v for entry in log.values() for k, v in entry.items() if k.startswith("rho:")]
    assert len(rhos) == 3 * len(hooked_layers(clients[0].model))
    assert rhos == pytest.approx([1 / 3] * len(rhos), abs=1e-12)
    ref_server, ref_clients = federation(
        fedavg, tiny_run_config(store, split, "fedavg", augment="none"), same_generators=True
    )
    run_rounds(ref_server, ref_clients, 2)
    assert_close(server.global_state, ref_server.global_state)


def fabricated_replies(server, similarities):
    torch.manual_seed(1)
    states = [
        {
            k: torch.randn_like(v.float()).to(v.dtype) if v.is_floating_point() else v + i
            for k, v in server.global_state.items()
        }
        for i in range(len(similarities))
    ]
    replies = [{"state": s, "num_samples": 5, "steps": 1} for s in states]
    server.query(1, replies)
    for r, sim in zip(replies, similarities):
        r["answer"] = {"similarity": sim}
    return replies, states


def test_fedlwr_layerwise_weights_apply_to_every_tensor_of_a_layer(tiny_task):
    store, split = tiny_task
    server, clients = federation(fedlwr, tiny_run_config(store, split, "fedlwr"))
    layers = hooked_layers(clients[0].model)
    rng = np.random.default_rng(0)
    sims = [{layer: float(rng.uniform(0.2, 0.95)) for layer in layers} for _ in range(3)]
    replies, states = fabricated_replies(server, sims)
    server.aggregate(1, replies)
    for key in (
        "encoders.0.0.weight",
        "encoders.0.1.weight",
        "encoders.0.1.running_mean",
        "encoders.0.1.running_var",
        "upconvs.1.bias",
        "head.bias",
    ):
        layer = key.rpartition(".")[0]
        gaps = [1 - s[layer] for s in sims]
        rho = [g / sum(gaps) for g in gaps]
        expected = weighted_average(states, rho, [key])[key]
        assert torch.allclose(server.global_state[key], expected, atol=1e-6), key
    assert int(server.global_state["encoders.0.1.num_batches_tracked"]) == max(
        int(s["encoders.0.1.num_batches_tracked"]) for s in states
    )


def test_fedlwr_lastlayer_applies_one_weight_per_client_to_every_layer(tiny_task):
    store, split = tiny_task
    cfg = tiny_run_config(store, split, "fedlwr", method_params={"scope": "last_layer"})
    server, clients = federation(fedlwr, cfg)
    assert clients[0].layers == ["bottleneck.4"]
    sims = [{"bottleneck.4": v} for v in (0.9, 0.6, 0.3)]
    replies, states = fabricated_replies(server, sims)
    server.aggregate(1, replies)
    rho = [0.1 / 1.2, 0.4 / 1.2, 0.7 / 1.2]
    expected = weighted_average(states, rho, sorted(states[0]))
    assert_close(server.global_state, expected)
    assert [server.round_log(1)[k]["rho:bottleneck.4"] for k in range(3)] == pytest.approx(rho)


def test_fedlwr_cosine_variant_runs_and_logs_similarities(fair_task):
    store, split = fair_task
    server, clients = federation(fedlwr, tiny_run_config(store, split, "fedlwr", method_params={"measure": "cosine"}))
    run_rounds(server, clients, 1)
    values = [v for entry in server.round_log(1).values() for k, v in entry.items() if k.startswith("cka:")]
    assert values and all(-1.0 <= v <= 1.0 + 1e-9 for v in values)


# --- q-FedAvg -----------------------------------------------------------------------------------
def test_qfedavg_with_q0_is_the_uniform_mean_of_the_local_models(tiny_task):
    store, split = tiny_task
    cfg = tiny_run_config(
        store, split, "qfedavg", method_params={"q": 0.0}, aggregation={"weighting": "samples", "bn_buffers": "average"}
    )
    server, clients = federation(qfedavg, cfg)
    replies = run_rounds(server, clients, 1)
    params = parameter_keys(clients[0].model)
    mean = weighted_average([r["state"] for r in replies], [1 / 3] * 3, sorted(params))
    assert_close({k: server.global_state[k] for k in params}, mean, atol=1e-6)
    assert all(r["loss"] > 0 for r in replies)


def test_qfedavg_two_clients_by_hand():
    from fedmedbench.runconfig import RunConfig
    from tests.conftest import toy_run_config

    # 2F/||w - w̄||² (100 and 20) exceeds 1/η = 2 for both clients: the smoothness cap leaves L = 1/η.
    cfg = toy_run_config(method_params={**qfedavg.DEFAULTS, "q": 2.0}, optimizer={"name": "sgd", "lr": 0.5})
    assert isinstance(cfg, RunConfig)
    model = torch.nn.Linear(2, 1)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, 2.0]]))
        model.bias.fill_(0.5)
    server = qfedavg.Server(cfg, model, 2)
    # L = 1/0.5 = 2; client 1: w̄ = w - [0.1, 0, 0] -> Δw = [0.2, 0, 0], F = 0.5;
    # client 2: w̄ = w - [0, 0.3, 0.1] -> Δw = [0, 0.6, 0.2], F = 1.0
    w = {"weight": torch.tensor([[1.0, 2.0]]), "bias": torch.tensor([0.5])}
    s1 = {"weight": w["weight"] - torch.tensor([[0.1, 0.0]]), "bias": w["bias"].clone()}
    s2 = {"weight": w["weight"] - torch.tensor([[0.0, 0.3]]), "bias": w["bias"] - 0.1}
    server.aggregate(1, [{"state": s1, "loss": 0.5, "num_samples": 1}, {"state": s2, "loss": 1.0, "num_samples": 1}])
    F1, F2, q, L = 0.5 + 1e-10, 1.0 + 1e-10, 2.0, 2.0
    d1, d2 = np.array([0.2, 0.0, 0.0]), np.array([0.0, 0.6, 0.2])
    h = q * F1 ** (q - 1) * d1 @ d1 + L * F1**q + q * F2 ** (q - 1) * d2 @ d2 + L * F2**q
    step = (F1**q * d1 + F2**q * d2) / h
    expected = np.array([1.0, 2.0, 0.5]) - step
    got = np.concatenate([server.global_state["weight"].flatten().numpy(), server.global_state["bias"].numpy()])
    assert got == pytest.approx(expected, abs=1e-6)


# --- Ditto ---------------------------------------------------------------------------------------
def test_ditto_lambda0_personal_follows_solo_and_global_follows_fedavg(tiny_task):
    store, split = tiny_task
    server, clients = federation(ditto, tiny_run_config(store, split, "ditto", method_params={"lam": 0.0}))
    run_rounds(server, clients, 2)
    solo_server, solo_clients = federation(solo, tiny_run_config(store, split, "solo"))
    run_rounds(solo_server, solo_clients, 2)
    avg_server, _ = federation(fedavg, tiny_run_config(store, split, "fedavg"))
    run_rounds(avg_server, _, 2)
    for c, s in zip(clients, solo_clients):
        for k, v in c.personal.state_dict().items():
            assert torch.equal(v, s.model.state_dict()[k]), k
    for k in avg_server.global_state:
        assert torch.equal(server.global_state[k], avg_server.global_state[k]), k


def test_ditto_lambda_pulls_the_personal_model_towards_the_global(tiny_task):
    store, split = tiny_task
    distances = []
    for lam in (0.0, 10.0):
        server, clients = federation(ditto, tiny_run_config(store, split, "ditto", method_params={"lam": lam}))
        run_rounds(server, clients, 2)
        distances.append(
            sum(
                float(((p.detach() - q.detach()) ** 2).sum())
                for p, q in zip(clients[0].personal.parameters(), clients[0].model.parameters())
            )
        )
    assert distances[1] < distances[0]


# --- FedCE ---------------------------------------------------------------------------------------
def test_fedce_minus_model_identity():
    torch.manual_seed(0)
    thetas = [{"w": torch.randn(5), "n": torch.tensor(4)} for _ in range(3)]
    c = [0.2, 0.3, 0.5]
    global_state = {"w": sum(ci * t["w"] for ci, t in zip(c, thetas)), "n": torch.tensor(4)}
    for i in range(3):
        minus = fedce.minus_model(global_state, thetas[i], c[i])
        expected = sum(c[j] * thetas[j]["w"] for j in range(3) if j != i) / (1 - c[i])
        assert torch.allclose(minus["w"], expected, atol=1e-6) and int(minus["n"]) == 4


def test_fedce_combination_rules():
    assert fedce.combine_contributions([0.0] * 4, [0.3] * 4, "sum", 1e-3) == pytest.approx([0.25] * 4)
    assert fedce.combine_contributions([1.0] * 4, [0.3] * 4, "multi", 1e-3) == pytest.approx([0.25] * 4)
    a, s = [1.0, 1.0, 1.0], [0.1, 0.2, 0.7]  # uniform a: Sum ∝ 1/3 + s, Multi ∝ s
    assert fedce.combine_contributions(a, s, "sum", 1e-3) == pytest.approx([(1 / 3 + x) / 2 for x in s])
    assert fedce.combine_contributions(a, s, "multi", 1e-3) == pytest.approx(s)
    assert (
        fedce.combine_contributions(a, [0.1, 0.2, 0.3], "sum", 1e-3)[2]
        > fedce.combine_contributions(a, [0.1, 0.2, 0.3], "sum", 1e-3)[0]
    )


@pytest.mark.parametrize("combine", ["sum", "multi"])
def test_fedce_identical_updates_and_equal_scores_give_uniform_fedavg(tiny_task, combine):
    store, split = tiny_task
    server, clients = federation(fedce, tiny_run_config(store, split, "fedce", method_params={"combine": combine}))
    base = {k: v.clone() for k, v in server.global_state.items()}
    for r in (1, 2):
        torch.manual_seed(r)
        update = {k: torch.randn_like(v) * 0.01 if v.is_floating_point() else v + 1 for k, v in base.items()}
        replies = [
            {
                "state": {k: base[k] + update[k] if v.is_floating_point() else update[k] for k, v in base.items()},
                "num_samples": 4,
                "steps": 1,
                "answer": {"score": 0.4},
            }
            for _ in range(3)
        ]
        server.aggregate(r, replies)
        assert server.coefficients == pytest.approx([1 / 3] * 3)
        expected = weighted_average([x["state"] for x in replies], [1 / 3] * 3, sorted(base))
        assert_close(server.global_state, expected)
        base = {k: v.clone() for k, v in server.global_state.items()}


def test_fedce_runs_with_minus_model_scores(tiny_task):
    store, split = tiny_task
    server, clients = federation(fedce, tiny_run_config(store, split, "fedce"))
    run_rounds(server, clients, 2)
    assert all(len(c.minus_dice) == 2 and c.minus_dice[0] == 0.0 for c in clients)
    assert sum(server.coefficients) == pytest.approx(1.0, abs=1e-2)


# --- CGSV ----------------------------------------------------------------------------------------
def test_cgsv_identical_clients_stay_identical(identical_task):
    store, split = identical_task
    cfg = tiny_run_config(store, split, "cgsv", augment="none", method_params={"beta": 1.0e7})
    server, clients = federation(cgsv, cfg, same_generators=True)
    run_rounds(server, clients, 2)
    assert server.reputation == pytest.approx([1 / 3] * 3)
    first = clients[0].model.state_dict()
    for c in clients[1:]:
        for k, v in c.model.state_dict().items():
            assert torch.equal(v, first[k]), k


def test_cgsv_normalised_update_and_sparse_reward():
    t = torch.tensor([0.1, -3.0, 2.0, 0.5])
    assert torch.equal(cgsv.top_magnitude(t, 0.5), torch.tensor([0.0, -3.0, 2.0, 0.0]))
    assert torch.equal(cgsv.top_magnitude(t, 1.0), t)


# --- CFFL ----------------------------------------------------------------------------------------
def test_cffl_full_sharing_is_fedavg_in_delta_form(tmp_path):
    store, split = write_fair_task(tmp_path / "equal")
    params = {"upload_fraction": 1.0, "clip": None, "download": "full", "threshold_coef": 0.0}
    server, clients = federation(cffl, tiny_run_config(store, split, "cffl", method_params=params))
    run_rounds(server, clients, 1)
    assert server.reputable == [True] * 3 and sum(server.reputation) == pytest.approx(1.0)
    ref_server, _ = federation(fedavg, tiny_run_config(store, split, "fedavg"))
    run_rounds(ref_server, _, 1)
    keys = parameter_keys(clients[0].model)
    # One round: w + mean(w_k - w) vs mean(w_k) differ by float rounding only (over more rounds Adam
    # amplifies that rounding to ~1e-5).
    for c in clients:
        assert_close(params_of(c.model), {k: ref_server.global_state[k] for k in keys}, atol=1e-6)


def test_cffl_upload_keeps_the_largest_entries():
    update = {"a": torch.tensor([1.0, -5.0]), "b": torch.tensor([[0.5, 3.0]])}
    out = cffl.top_fraction(update, 0.5)
    assert torch.equal(out["a"], torch.tensor([0.0, -5.0])) and torch.equal(out["b"], torch.tensor([[0.0, 3.0]]))


# --- resume ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "run, params",
    [
        ("fedlwr", {}),
        ("qfedavg", {"q": 1.0}),
        ("cffl", {}),
        ("cgsv", {}),
        ("ditto", {}),
        ("fedce", {"combine": "multi"}),
    ],
)
@pytest.mark.slow  # outside `make test`: a long run; `make test-all` runs it
def test_resume_gives_the_same_run(tmp_path, fair_task, monkeypatch, run, params):
    store, split = fair_task
    cfg = tiny_run_config(store, split, run, rounds=2, method_params=params)
    straight = run_training(cfg, tmp_path / "straight", progress=False)
    interrupt_after_round(cfg, tmp_path / "resumed", monkeypatch)
    resumed = run_training(cfg, tmp_path / "resumed", progress=False)
    assert straight == resumed
    assert (tmp_path / "straight" / "history.csv").read_text() == (tmp_path / "resumed" / "history.csv").read_text()
